import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { chat, expectNoLoad, fault, post, putCluster, resetClusterState, resetSim } from "./helpers";

// Issue 12: one Durable Object round trip on the hot path of a request (pick + lease); prefill
// done, finish and counters off the response path. The request log line counts the calls
// (`stateCalls`) and how many of them came before the response (`stateCallsBeforeResponse`).

const rr = { prefill: "round_robin", decode: "round_robin" };

async function logged(requestId: string, run: () => Promise<void>): Promise<any> {
  const lines: string[] = [];
  vi.spyOn(console, "log").mockImplementation((...args: unknown[]) => void lines.push(args.map(String).join(" ")));
  await run();
  // the stream's line comes when it ends; the finish call after it
  await expectNoLoad();
  vi.restoreAllMocks();
  const entry = lines
    .map((l) => {
      try {
        return JSON.parse(l);
      } catch {
        return null;
      }
    })
    .find((e) => e?.event === "request" && e.requestId === requestId);
  expect(entry, `log line of ${requestId}`).toBeTruthy();
  return entry;
}

describe("one Durable Object round trip before the response", () => {
  beforeEach(async () => {
    await resetSim();
    await resetClusterState();
  });
  afterEach(() => vi.restoreAllMocks());

  const cases: Array<[string, string, string, (stream: boolean) => unknown]> = [
    ["vllm", "/v1/chat/completions", "chat", (stream) => chat("hot path", { stream })],
    ["vllm", "/v1/completions", "completions", (stream) => ({ model: "sim-model", prompt: "hot path", max_tokens: 4, stream })],
    ["vllm", "/v1/responses", "responses", (stream) => ({ model: "sim-model", input: "hot path", max_output_tokens: 4, stream })],
    ["sglang", "/v1/chat/completions", "chat", (stream) => chat("hot path", { stream })],
    ["sglang", "/generate", "generate", (stream) => ({ text: "hot path", sampling_params: { max_new_tokens: 4 }, stream })],
    ["colocated", "/v1/chat/completions", "chat", (stream) => chat("hot path", { stream })],
  ];

  it.each(cases)("%s %s (%s), streamed and not", async (protocol, path, _, body) => {
    const nodes =
      protocol === "colocated"
        ? [{ id: "c0", role: "both" as const }]
        : [
            { id: "p0", role: "prefill" as const },
            { id: "d0", role: "decode" as const },
          ];
    await putCluster({ protocol, policy: rr, nodes });
    // the first request after a document change hands the object the new view (a second route call)
    await (await post(path, body(false))).text();
    await expectNoLoad();
    for (const stream of [false, true]) {
      const requestId = `hot-${protocol}-${path}-${stream}`;
      const entry = await logged(requestId, async () => {
        const res = await post(path, body(stream), { "x-request-id": requestId });
        expect(res.status).toBe(200);
        await res.text();
      });
      expect({ stream, outcome: entry.outcome, before: entry.stateCallsBeforeResponse }).toEqual({ stream, outcome: "ok", before: 1 });
      // route, then (off the response path) at most prefill done and finish
      expect(entry.stateCalls).toBeGreaterThanOrEqual(2);
      expect(entry.stateCalls).toBeLessThanOrEqual(protocol === "colocated" ? 2 : 3);
    }
  });

  it("a D slow to answer: P's report goes out while D works, and the response still waited for one call", async () => {
    await putCluster({
      protocol: "vllm",
      policy: rr,
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
      ],
    });
    await (await post("/v1/chat/completions", chat("warm"))).text();
    await expectNoLoad();
    for (const stream of [false, true]) {
      await fault("d0", { mode: "slow", delayMs: 600, count: 1 });
      const requestId = `hot-slow-d-${stream}`;
      const entry = await logged(requestId, async () => {
        const res = await post("/v1/chat/completions", chat("slow decode", { stream }), { "x-request-id": requestId });
        expect(res.status).toBe(200);
        await res.text();
      });
      expect(entry.decodeTtfbMs).toBeGreaterThanOrEqual(500);
      expect({ stream, before: entry.stateCallsBeforeResponse }).toEqual({ stream, before: 1 });
      expect(entry.stateCalls).toBe(3);
    }
  });

  it("the first request after a document change also waits for the object to keep the document, and says so", async () => {
    const nodes = [
      { id: "p0", role: "prefill" as const },
      { id: "d0", role: "decode" as const },
    ];
    for (const stream of [false, true]) {
      // a document this isolate has not seen: saved in the object as the last valid one (a new
      // isolate that meets an invalid one serves it), then handed to the object with the route call
      await putCluster({ protocol: "vllm", policy: rr, timeouts: { prefillMs: stream ? 60001 : 60002 }, nodes });
      const first = await logged(`doc-change-first-${stream}`, async () => {
        const res = await post("/v1/chat/completions", chat("new document", { stream }), { "x-request-id": `doc-change-first-${stream}` });
        expect(res.status).toBe(200);
        await res.text();
      });
      // save the document, route (the object has another version), route with the view
      expect({ stream, before: first.stateCallsBeforeResponse }).toEqual({ stream, before: 3 });
      expect(first.stateCalls).toBeGreaterThanOrEqual(4);
      const next = await logged(`doc-change-next-${stream}`, async () => {
        const res = await post("/v1/chat/completions", chat("same document", { stream }), { "x-request-id": `doc-change-next-${stream}` });
        expect(res.status).toBe(200);
        await res.text();
      });
      expect({ stream, before: next.stateCallsBeforeResponse }).toEqual({ stream, before: 1 });
    }
  });

  it("a one-hop request: route and finish", async () => {
    await putCluster({
      protocol: "vllm",
      policy: rr,
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
      ],
    });
    await (await post("/tokenize", { model: "sim-model", prompt: "warm" })).text();
    await expectNoLoad();
    const entry = await logged("hot-tokenize", async () => {
      const res = await post("/tokenize", { model: "sim-model", prompt: "x" }, { "x-request-id": "hot-tokenize" });
      expect(res.status).toBe(200);
      await res.text();
    });
    expect(entry.stateCallsBeforeResponse).toBe(1);
    expect(entry.stateCalls).toBe(2);
  });
});
