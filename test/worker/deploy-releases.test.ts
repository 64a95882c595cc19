// Issue 18 item 7: P's unread KV handle is released only when no D may have read it. A release
// is a request D rejects before admission, which makes D tell P to free the handle (vLLM >= 0.21,
// docs/engines.md); if a D already read it, or already told P itself, P logs "Potentially
// invalid KV blocks for unrecognized request" — the operator's sign of KV corruption. So the
// router releases when no engine got the handle (unreachable, refused by something in front of
// the engine, a stream D's server never answered) and leaves it to D when D's engine may have it
// (its own refusal, its abort path, its read).
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { decodeContact, notifiesPItself, releasesUnreadHandle } from "../../src/forward/handle-release";
import { UpstreamFailure } from "../../src/forward/upstream";
import { chat, control, expectNoLoad, fault, post, putCluster, resetClusterState, resetSim } from "./helpers";
import { answerText, expectedPrefix, kvParamsReceived, stats, waitFor } from "./engines-helpers";

const rr = { prefill: "round_robin", decode: "round_robin" };
const RELEASE = "pd-edge-router-release";
const releasesAt = async (ids: string[]) => (await Promise.all(ids.map(kvParamsReceived))).flat().filter((r) => r.model === RELEASE);

describe("7. which failed decode attempts release P's handle (what the router saw of D)", () => {
  const f = (kind: UpstreamFailure["kind"], answeredBy: "engine" | "front" | null = null, status: number | null = null, headersSeen = false) =>
    new UpstreamFailure("decode", "d0", kind, "x", status, null, answeredBy, null, headersSeen);
  it.each([
    // [what, failure, stream, release]
    ["the connection failed", f("connect"), false, true],
    ["a proxy, tunnel or Access page answered (not JSON)", f("status", "front", 502), false, true],
    ["a redirect (an Access login)", f("status", "front", 302), false, true],
    ["the engine refused it (JSON)", f("status", "engine", 500), false, false],
    ["the engine was busy (JSON 503)", f("status", "engine", 503), true, false],
    ["a stream: no headers in time (D's server never gave it to its engine; vLLM >= 0.21 tells P as the router hangs up)", f("timeout"), true, false],
    ["a stream: headers, then no first byte in time", f("timeout", null, null, true), true, false],
    ["non-streamed: no answer in time (D may be generating)", f("timeout"), false, false],
    ["the request ended while D had it", f("aborted"), true, false],
    ["D broke off after its headers", f("broken"), true, false],
    ["D answered something unusable", f("protocol"), false, false],
  ] as const)("%s -> release: %s", (_what, failure, stream, release) => {
    expect(releasesUnreadHandle(decodeContact(failure, stream))).toBe(release);
  });
  it("a request that ended before D was sent the handle releases it", () => {
    expect(releasesUnreadHandle("unsent")).toBe(true);
  });
  it("a D older than vLLM 0.21 tells P nothing when its serving layer refuses or drops the request: the router releases", () => {
    expect(releasesUnreadHandle(decodeContact(f("timeout"), true), notifiesPItself("0.20.2"))).toBe(true);
    expect(releasesUnreadHandle(decodeContact(f("status", "engine", 500), false), notifiesPItself("0.20.2"))).toBe(true);
    // what the engine may have read stays the engine's, whatever its version
    expect(releasesUnreadHandle(decodeContact(f("timeout", null, null, true), true), notifiesPItself("0.20.2"))).toBe(false);
    expect(releasesUnreadHandle(decodeContact(f("timeout"), true), notifiesPItself("0.21.0"))).toBe(false);
  });
  it("reads a node's vllmVersion: absent or 0.21 and newer tell P themselves", () => {
    expect([undefined, "0.21.0", "0.21", "0.22.1rc1", "1.0.0", "0.21.1+cu128"].map(notifiesPItself)).toEqual([true, true, true, true, true, true]);
    expect(["0.20.2", "0.9.1", "0.20.1rc2", "0.11"].map(notifiesPItself)).toEqual([false, false, false, false]);
  });
});

describe("7. releases through the Worker, against the strict simulator", () => {
  /** P, the faulty d0 (with `d0Fields`) and the healthy d1, round robin. */
  const putReleaseCluster = (d0Fields: Record<string, unknown> = {}) =>
    putCluster({
      protocol: "vllm",
      policy: rr,
      // room for the healthy d1 on a busy machine; d0's silence and hang outlast it
      timeouts: { decodeFirstByteMs: 1500 },
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode", ...d0Fields },
        { id: "d1", role: "decode" },
      ],
    });

  beforeEach(async () => {
    await resetSim();
    await resetClusterState();
    await putReleaseCluster();
  });
  afterEach(resetSim);

  /** Two requests: round robin sends one of them to the faulty d0 first; both end on d1 with this prompt's answer. */
  async function twoRequests(stream = false) {
    for (const content of ["release case one", "release case two"]) {
      const body = chat(content, { stream });
      const res = await post("/v1/chat/completions", body);
      expect(res.status).toBe(200);
      expect(res.headers.get("x-pd-decode")).toBe("d1");
      const text = await res.text();
      expect(stream ? text.includes(expectedPrefix(body)) : answerText(JSON.parse(text)).startsWith(expectedPrefix(body))).toBe(true);
    }
    await expectNoLoad();
  }

  /**
   * d0 got one of the two requests, with P's handle, and its fault answered it: what the test says
   * about releases is about that attempt (a test whose requests both went to d1 first would find
   * no release for want of a failure).
   */
  async function d0HadTheHandle() {
    const atD0 = await kvParamsReceived("d0");
    expect(atD0).toHaveLength(1);
    expect(atD0[0]!.model).toBe("sim-model");
    expect(atD0[0]!.kv?.remote_engine_id).toBeTruthy();
    expect((await stats("d0")).faultsInjected).toBe(1);
  }

  /** P holds no handle within 2 s, and freed exactly one. */
  async function pFreedOneHandle() {
    const p0 = await waitFor(
      () => stats("p0"),
      (s) => s.heldHandles === 0,
      2000,
      "p0 holds no handle",
    );
    expect(p0.releasedHandles).toBe(1);
  }

  it.each([
    // [what, d0's fault, stream, P's handle freed (by the router's release or by D), released through the next D]
    [
      "D refused by a proxy in front of it (an HTML 502): released through the next D, P holds nothing",
      { mode: "respond", status: 502, headers: { "content-type": "text/html" }, body: "<html>502 Bad Gateway</html>", count: 1 },
      false,
      true,
      true,
    ],
    [
      "D's engine refused it (a JSON 503): no release — the engine told P itself (vLLM >= 0.21)",
      { mode: "respond", status: 503, headers: { "content-type": "application/json" }, body: '{"error":{"message":"busy"}}', count: 1 },
      false,
      false,
      false,
    ],
    ["D sent its stream's headers, then nothing before decodeFirstByteMs: no release — D's engine had it", { mode: "silent", delayMs: 6000, count: 1 }, true, false, false],
    // P is told once, by d0 (the simulator models vLLM >= 0.21's cancellation cleanup), not twice
    ["the same stuck stream on a D of vLLM 0.21 or newer (no vllmVersion): no release — D's cancelled route tells P itself", { mode: "hang", count: 1 }, true, true, false],
  ] as const)("%s", async (_what, d0Fault, stream, pFreed, released) => {
    await fault("d0", d0Fault);
    await twoRequests(stream);
    await d0HadTheHandle();
    if (pFreed) await pFreedOneHandle();
    // a release goes through d1; none at all where D's engine may have the handle
    expect(await releasesAt(released ? ["d1"] : ["d0", "d1"])).toHaveLength(released ? 1 : 0);
  });

  it("a stream whose D sent not even its headers within decodeFirstByteMs (its server is stuck), D older than vLLM 0.21: released through the next D", async () => {
    await putReleaseCluster({ vllmVersion: "0.20.2" });
    // the simulated d0 as vLLM < 0.21: its serving layer tells P nothing
    await control("/engines/d0/options", { rejectionReleasesHandle: false });
    try {
      await fault("d0", { mode: "hang", count: 1 });
      await twoRequests(true);
      await pFreedOneHandle();
      expect(await releasesAt(["d1"])).toHaveLength(1);
    } finally {
      await control("/engines/d0/options", { rejectionReleasesHandle: true });
    }
  });

  it("D unreachable: released through the next D", async () => {
    await control("/engines/d0/stop", {});
    try {
      await twoRequests();
      await pFreedOneHandle();
      expect(await releasesAt(["d1"])).toHaveLength(1);
    } finally {
      await control("/engines/d0/start", {});
    }
  });
});
