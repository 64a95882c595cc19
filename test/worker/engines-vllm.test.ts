// Issue 10 against the strict simulator, vllm protocol: single-use handles, release of unread
// handles, timeouts that fit how engines answer, usage as vLLM reports it, unique upstream ids.
import { SELF } from "cloudflare:test";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { chat, control, expectNoLoad, fault, post, putCluster, received, resetClusterState, resetSim, snapshot, type NodeSpec } from "./helpers";
import { allStats, answerText, enginesIdle, expectedPrefix, failuresByNode, kvParamsReceived, longPrompt, sseEvents, stats, streamedText, waitFor } from "./engines-helpers";

const rr = { prefill: "round_robin", decode: "round_robin" };
const vllm = (nodes: NodeSpec[], extra: Record<string, unknown> = {}) => putCluster({ protocol: "vllm", policy: rr, nodes, ...extra });
const P = (id: string): NodeSpec => ({ id, role: "prefill" });
const D = (id: string): NodeSpec => ({ id, role: "decode" });

async function fresh() {
  await resetSim();
  await resetClusterState();
}

// no test leaves a request open on an engine for the next one (a release slowed by a fault)
afterEach(() => enginesIdle());

/** Every decode-leg request D engines got that carried a handle (release requests apart). */
async function decodeHandles(ids: string[]) {
  const out: Array<{ node: string; kv: any; model: string }> = [];
  for (const id of ids) for (const r of await kvParamsReceived(id)) if (r.kv?.do_remote_prefill) out.push({ node: id, kv: r.kv, model: r.model });
  return out;
}

describe("a vLLM KV handle is single-use: a D retry gets a fresh handle from P", () => {
  beforeEach(fresh);

  // released: the router frees the failed attempt's handle only when no D engine got it (a reset,
  // a stream without even headers); an engine that answered, or may be generating, tells P itself
  // (src/forward/handle-release.ts)
  it.each([
    ["answers 500", { mode: "status500" }, {}, false, false],
    ["resets the connection", { mode: "reset" }, {}, false, true],
    // the timeouts leave the healthy d1 room to answer on a busy CI machine
    // no release: vLLM >= 0.21 (the default without a node vllmVersion) tells P itself when the router hangs up (deploy-releases.test.ts has the older D)
    ["sends no first byte in time (stream)", { mode: "hang" }, { decodeFirstByteMs: 1500 }, true, false],
    ["sends no answer in time (non-streamed)", { mode: "hang" }, { nonStreamMs: 2500 }, false, false],
  ] as const)("D that %s: P runs again, every D attempt had its own handle, the answer is this prompt's", async (_name, broken, timeouts, stream, released) => {
    await vllm([P("p0"), D("d0"), D("d1")], { timeouts });
    await fault("d0", broken);
    // round robin: of two requests, one meets the broken d0 first and is retried on d1
    const bodies = [chat("single-use handle one", { stream }), chat("single-use handle two", { stream })];
    for (const body of bodies) {
      const res = await post("/v1/chat/completions", body);
      expect(res.status).toBe(200);
      expect(res.headers.get("x-pd-decode")).toBe("d1");
      const text = stream ? streamedText(sseEvents(await res.text())) : answerText(await res.json());
      expect(text.startsWith(expectedPrefix(body))).toBe(true);
    }
    const attempts = await decodeHandles(["d0", "d1"]);
    // one attempt a request on d1, plus the failed one on d0
    expect(attempts.filter((a) => a.model !== "pd-edge-router-release").length).toBe(3);
    const handles = attempts.filter((a) => a.model !== "pd-edge-router-release").map((a) => `${a.kv.remote_engine_id}/${a.kv.remote_request_id}`);
    expect(new Set(handles).size).toBe(handles.length);
    const p0 = await stats("p0");
    expect(p0.requests.vllmPrefill).toBe(3);
    expect((await stats("d1")).staleHandleReads).toBe(0);
    expect((await stats("d1")).foreignHandleReads).toBe(0);
    if (released) {
      // the failed attempt's handle is read by no D: it is released, not held for kvHoldTimeoutMs
      const held = await waitFor(
        () => stats("p0"),
        (s) => s.heldHandles === 0,
        2000,
        "p0 holds no handle",
      );
      expect(held.expiredHandles).toBe(0);
    }
    await expectNoLoad();
    // D had the handle (it answered, or held the request): a release would be a second word to P about it (a false alarm)
    const releases = (await decodeHandles(["d0", "d1"])).filter((a) => a.model === "pd-edge-router-release");
    expect(releases).toHaveLength(released ? 1 : 0);
  });
});

describe("prefill blocks that no D will read are released promptly", () => {
  beforeEach(fresh);
  afterEach(() => control("/engines/d0/start", {}));

  it("a D that refuses the connection: its handle is released through the D tried next (404 rejection), not held for kvHoldTimeoutMs", async () => {
    await vllm([P("p0"), D("d0"), D("d1")]);
    await control("/engines/d0/stop", {});
    for (const content of ["refused one", "refused two"]) {
      const body = chat(longPrompt(content, 2000));
      const res = await post("/v1/chat/completions", body);
      expect(res.status).toBe(200);
      expect(answerText(await res.json()).startsWith(expectedPrefix(body))).toBe(true);
    }
    const p0 = await waitFor(
      () => stats("p0"),
      (s) => s.heldHandles === 0,
      2000,
      "p0 holds no handle",
    );
    expect(p0.heldBlocks).toBe(0);
    expect(p0.expiredHandles).toBe(0);
    expect(p0.consumedHandles).toBe(2);
    // the request that met d0 first: its first handle was released, not left to the timeout
    expect(p0.releasedHandles).toBe(p0.issuedHandles - 2);
    expect(p0.releasedHandles).toBeGreaterThanOrEqual(1);
    const releases = (await kvParamsReceived("d1")).filter((r) => r.model === "pd-edge-router-release");
    expect(releases.length).toBe(p0.releasedHandles);
    expect(releases[0]!.kv.do_remote_prefill).toBe(true);
    expect((await stats("d1")).rejectedHandleRequests).toBe(releases.length);
    expect((await stats("d1")).staleHandleReads).toBe(0);
    await expectNoLoad();
  });

  it("the client leaves while D holds the request, before its first byte: no release (D's own abort path tells P)", async () => {
    await vllm([P("p0"), D("d0")]);
    // d0 takes the connection but does nothing with it for 1.5 s (the handle is not read)
    await fault("d0", { mode: "slow", delayMs: 1500, count: 1 });
    const controller = new AbortController();
    const pending = SELF.fetch("http://router/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(chat(longPrompt("abandoned", 2000))),
      signal: controller.signal,
    });
    await waitFor(
      () => stats("d0"),
      (s) => s.inflight >= 1,
      3000,
      "d0 got the request",
    );
    expect((await stats("p0")).heldHandles).toBe(1);
    controller.abort();
    await expect(pending).rejects.toThrow();
    await expectNoLoad();
    // vLLM cancels the request when the router's connection closes and tells P itself
    // (src/forward/handle-release.ts); a release from the router would reach P a second time
    expect((await kvParamsReceived("d0")).filter((r) => r.model === "pd-edge-router-release")).toHaveLength(0);
  });

  it("clients that leave at any moment leave no handle held", async () => {
    await vllm([P("pslow"), D("d0"), D("d1")]);
    // pslow prefills 2000 tokens in ~100 ms; clients leave from 0 to 200 ms
    const outcomes = await Promise.all(
      Array.from({ length: 12 }, async (_, i) => {
        const controller = new AbortController();
        setTimeout(() => controller.abort(), i * 17);
        try {
          const res = await SELF.fetch("http://router/v1/chat/completions", {
            method: "POST",
            headers: { "content-type": "application/json" },
            body: JSON.stringify(chat(longPrompt(`leaver ${i}`, 2000))),
            signal: controller.signal,
          });
          await res.text();
          return res.status;
        } catch {
          return "aborted";
        }
      }),
    );
    expect(outcomes.some((o) => o === "aborted")).toBe(true);
    // Every handle a D saw (as a request, or as the router's release) is freed: read, or told to P
    // by D's own abort path. The one case the router leaves to P's timeout by design is a client
    // leaving while D's request is on the wire: D may have it, and a release would then be a false
    // KV-corruption alarm on P (src/forward/handle-release.ts) — so a handle no D ever saw may stay.
    const seenByD = async () =>
      new Set(
        (await Promise.all(["d0", "d1"].map(kvParamsReceived)))
          .flat()
          .filter((r) => r.kv?.remote_request_id)
          .map((r) => r.kv.remote_request_id as string),
      ).size;
    let unseen = 0;
    const p = await waitFor(
      async () => {
        const s = await stats("pslow");
        unseen = s.issuedHandles - (await seenByD());
        return s;
      },
      (s) => s.heldHandles <= unseen,
      3000,
      "pslow holds no handle a D saw",
    );
    expect(p.issuedHandles).toBe(p.consumedHandles + p.releasedHandles + p.heldHandles);
    expect(p.expiredHandles).toBe(0);
    await expectNoLoad();
  });
});

describe("timeouts that fit how engines answer", () => {
  beforeEach(fresh);

  it("a non-streamed answer slower than decodeFirstByteMs but within nonStreamMs succeeds and does not count against D", async () => {
    await vllm([P("p0"), D("d0"), D("d1")], { timeouts: { decodeFirstByteMs: 300, nonStreamMs: 5000 } });
    await fault("d0", { mode: "slow", delayMs: 700 });
    await fault("d1", { mode: "slow", delayMs: 700 });
    const body = chat("a long non-streamed answer");
    const started = Date.now();
    const res = await post("/v1/chat/completions", body);
    expect(res.status).toBe(200);
    expect(Date.now() - started).toBeGreaterThanOrEqual(700);
    expect(answerText(await res.json()).startsWith(expectedPrefix(body))).toBe(true);
    // no retry: one D attempt, one P run
    expect((await received("d0")).length + (await received("d1")).length).toBe(1);
    expect((await stats("p0")).requests.vllmPrefill).toBe(1);
    await expectNoLoad();
    expect(Object.values(await failuresByNode(snapshot)).every((n) => n === 0)).toBe(true);
    const metrics = await (await SELF.fetch("http://router/metrics")).text();
    const failures = metrics.split("\n").filter((l) => l.startsWith("pd_router_node_failures_total{"));
    expect(failures.length).toBeGreaterThan(0);
    expect(failures.every((l) => l.trim().endsWith(" 0"))).toBe(true);
  });

  it("a stream whose headers come at once but whose first byte is late fails over (the timer runs to the first body byte)", async () => {
    // d1's first byte must come within the timeout on a busy machine; d0's never does
    await vllm([P("p0"), D("d0"), D("d1")], { timeouts: { decodeFirstByteMs: 1500 } });
    await fault("d0", { mode: "silent", delayMs: 6000 });
    for (const content of ["late first byte one", "late first byte two"]) {
      const body = chat(content, { stream: true });
      const res = await post("/v1/chat/completions", body);
      expect(res.status).toBe(200);
      expect(res.headers.get("x-pd-decode")).toBe("d1");
      expect(streamedText(sseEvents(await res.text())).startsWith(expectedPrefix(body))).toBe(true);
    }
    expect((await received("d0")).length).toBe(1);
    // the router closed d0 after its headers and before its first body byte, which d0 never sent
    const d0 = await stats("d0");
    expect({ aborts: d0.clientAborts, tokens: d0.outputTokens }).toEqual({ aborts: 1, tokens: 0 });
    expect((await failuresByNode(snapshot)).d0).toBe(1);
    expect((await stats("d1")).staleHandleReads).toBe(0);
    await expectNoLoad();
  });

  it("with a single D, headers then silence beyond decodeFirstByteMs is a 504", async () => {
    await vllm([P("p0"), D("d0")], { timeouts: { decodeFirstByteMs: 300 } });
    await fault("d0", { mode: "silent", delayMs: 1500 });
    const res = await post("/v1/chat/completions", chat("silent D", { stream: true }));
    expect(res.status).toBe(504);
    expect(((await res.json()) as any).error.code).toBe("upstream_timeout");
    // the timeout closed d0 before its first body byte: d0 never sent one
    const d0 = await stats("d0");
    expect({ aborts: d0.clientAborts, tokens: d0.outputTokens }).toEqual({ aborts: 1, tokens: 0 });
    await expectNoLoad();
  });
});

describe("usage as the client sees it: P's prompt counts, 0 cached on a cold request", () => {
  beforeEach(fresh);

  /** P's figures for the one prefill it ran. */
  async function prefillRecord() {
    const recs = Object.values(await control("/engines/p0/request-stats")) as Array<{ promptTokens: number; cachedTokens: number }>;
    expect(recs.length).toBe(1);
    return recs[0]!;
  }

  it("non-streamed: cached_tokens 0 (D counted the pulled KV as cached), prompt_tokens from P, total recomputed", async () => {
    await vllm([P("p0"), D("d0")]);
    const body = chat(longPrompt("cold usage", 3000), { max_tokens: 5 });
    const res = await post("/v1/chat/completions", body);
    expect(res.status).toBe(200);
    const json: any = await res.json();
    expect(answerText(json).startsWith(expectedPrefix(body))).toBe(true);
    const p = await prefillRecord();
    expect(p.cachedTokens).toBe(0);
    expect(json.usage.prompt_tokens).toBe(p.promptTokens);
    expect(json.usage.prompt_tokens_details?.cached_tokens ?? 0).toBe(0);
    expect(json.usage.completion_tokens).toBe(5);
    expect(json.usage.total_tokens).toBe(p.promptTokens + 5);
    await expectNoLoad();
  });

  it("streamed with include_usage: only the final usage frame is rewritten", async () => {
    await vllm([P("p0"), D("d0")]);
    const body = chat(longPrompt("cold stream usage", 3000), { max_tokens: 5, stream: true, stream_options: { include_usage: true } });
    const res = await post("/v1/chat/completions", body);
    expect(res.status).toBe(200);
    const events = sseEvents(await res.text());
    expect(events.at(-1)).toBe("[DONE]");
    const withUsage = events.filter((e) => e !== "[DONE]" && e.usage);
    expect(withUsage.length).toBe(1);
    expect(events.indexOf(withUsage[0])).toBe(events.length - 2);
    const p = await prefillRecord();
    const usage = withUsage[0].usage;
    expect(usage.prompt_tokens).toBe(p.promptTokens);
    expect(usage.prompt_tokens_details?.cached_tokens ?? 0).toBe(0);
    expect(usage.total_tokens).toBe(p.promptTokens + usage.completion_tokens);
    // the token frames are D's, untouched
    const frames = events.slice(0, -2);
    expect(frames.length).toBe(5);
    expect(frames.every((e) => e.object === "chat.completion.chunk" && !("usage" in e) && e.choices.length === 1)).toBe(true);
    expect(streamedText(events).startsWith(expectedPrefix(body))).toBe(true);
    await expectNoLoad();
  });

  it("a D run with --enable-force-include-usage sends a usage frame the client did not ask for: it too carries P's counts, not D's", async () => {
    await vllm([P("p0"), D("d2")]);
    // d2 serves only this test in this file: its option stays with it
    await control("/engines/d2/options", { forceIncludeUsage: true });
    const body = chat(longPrompt("forced usage", 3000), { max_tokens: 5, stream: true });
    const res = await post("/v1/chat/completions", body);
    expect(res.status).toBe(200);
    const events = sseEvents(await res.text());
    const withUsage = events.filter((e) => e !== "[DONE]" && e.usage);
    expect(withUsage.length).toBe(1);
    const p = await prefillRecord();
    expect(withUsage[0].usage.prompt_tokens).toBe(p.promptTokens);
    // D counted the KV it pulled as cached: the client would see a cold prompt as cached
    expect(withUsage[0].usage.prompt_tokens_details?.cached_tokens ?? 0).toBe(0);
    expect(withUsage[0].usage.completion_tokens).toBe(5);
    await expectNoLoad();
  });

  it("a warm request reports P's cached tokens, not D's", async () => {
    await vllm([P("p0"), D("d0")]);
    const long = longPrompt("warm usage", 3000);
    await (await post("/v1/chat/completions", chat(long))).text();
    const res = await post("/v1/chat/completions", chat(long));
    const json: any = await res.json();
    const recs = Object.values(await control("/engines/p0/request-stats")) as Array<{ promptTokens: number; cachedTokens: number }>;
    const second = recs.at(-1)!;
    expect(second.cachedTokens).toBeGreaterThan(0);
    expect(second.cachedTokens).toBeLessThan(second.promptTokens);
    expect(json.usage.prompt_tokens_details.cached_tokens).toBe(second.cachedTokens);
    await expectNoLoad();
  });
});

describe("upstream request ids are unique per request", () => {
  beforeEach(fresh);

  it("two concurrent requests with the same x-request-id: engines see distinct ids, each client gets its own id back", async () => {
    await vllm([P("pslow"), D("d0")]);
    // P holds each prefill 2 s: the second request reaches P while the first is still there (the
    // test waits for that state rather than hoping the two arrive close together)
    await fault("pslow", { mode: "slow", delayMs: 2000, count: 2 });
    const bodies = [chat(longPrompt("same id one", 4000)), chat(longPrompt("same id two", 4000))];
    const send = (b: unknown) => post("/v1/chat/completions", b, { "x-request-id": "client-reused-id" });
    const firstResponse = send(bodies[0]);
    await waitFor(
      () => stats("pslow"),
      (s) => s.inflight === 1,
      5000,
      "the first prefill on P",
    );
    const secondResponse = send(bodies[1]);
    // both on P at once: an engine that keys requests by id would see the two together
    await waitFor(
      () => stats("pslow"),
      (s) => s.inflight === 2,
      5000,
      "both prefills on P at once",
    );
    const responses = await Promise.all([firstResponse, secondResponse]);
    for (const [i, res] of responses.entries()) {
      expect(res.status).toBe(200);
      expect(res.headers.get("x-request-id")).toBe("client-reused-id");
      expect(answerText(await res.json()).startsWith(expectedPrefix(bodies[i]))).toBe(true);
    }
    const pIds = (await received("pslow")).map((r) => r.headers["x-request-id"]);
    const dIds = (await received("d0")).map((r) => r.headers["x-request-id"]);
    expect(pIds.length).toBe(2);
    expect(new Set(pIds).size).toBe(2);
    expect(new Set(dIds).size).toBe(2);
    const all = await allStats();
    expect(Object.values(all).reduce((n, s) => n + s.duplicateRequestIds, 0)).toBe(0);
    await expectNoLoad();
  });
});
