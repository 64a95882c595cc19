import { beforeAll, describe, expect, it } from "vitest";
import { kv, poll, post, putNodes, resetState, setMetrics, signalsRig, snapshot, useSignalsRig, waitFor } from "./signals-helpers";

useSignalsRig();

// An engine that streams several tokens an event: vLLM and SGLang `--stream-interval N` send the
// first token at once, then one event every N tokens (vllm/v1/engine/output_processor.py
// RequestState.make_request_output), and Dynamo's vLLM frontend streams 20 at a time by default.
// The router learns D's decode step from the gaps of the streams it relays (SPEC 9): counted by
// events, d0's step would come out several times its real one. Here d0 streams 8 tokens an event
// and d1 one, on the same simulated speed; the router must learn the same step for both.

const OUT = 40;

/** Sets a simulated engine's tunables (sim/cluster.mjs POST /engines/:id/options): this file's own rig. */
async function engineOptions(id: string, options: Record<string, unknown>): Promise<void> {
  const res = await fetch(`${signalsRig().simControlUrl}/engines/${id}/options`, { method: "POST", body: JSON.stringify(options) });
  if (!res.ok) throw new Error(`options ${id}: ${res.status}`);
  await res.arrayBuffer();
}

/** Streams one chat request; returns the D that served it. */
async function stream(i: number, usage: boolean): Promise<string> {
  const res = await post("/v1/chat/completions", {
    model: "sim-model",
    messages: [{ role: "user", content: `stream interval ${i}` }],
    max_tokens: OUT,
    stream: true,
    ...(usage ? { stream_options: { include_usage: true } } : {}),
  });
  expect(res.status).toBe(200);
  const text = await res.text();
  expect(text).toContain("data: [DONE]");
  return res.headers.get("x-pd-decode")!;
}

/** Every request's finish report is in: the object holds no lease. */
const settled = () =>
  waitFor(
    "every lease released",
    async () => (await snapshot()).leases,
    (n) => n === 0,
  );

const rates = async (id: string) => (await snapshot()).nodes.find((n: { id: string }) => n.id === id)!.rates!;

/** p0, d0 and d1 under round-robin D, the object's learned rates forgotten; a prior near the engines' step, so what the streams teach shows at once. */
async function freshPool(): Promise<void> {
  await resetState();
  for (const id of ["p0", "d0", "d1"]) await setMetrics(id, kv(0.1));
  await putNodes(
    [
      { id: "p0", role: "prefill" },
      { id: "d0", role: "decode" },
      { id: "d1", role: "decode" },
    ],
    { profile: { decodeStepMs: 10 } },
  );
  await poll();
}

beforeAll(async () => {
  // a step of ~10 real ms on both Ds (1,000 simulated ms at the rig's time scale 0.01): long
  // enough that the relay's timing of 39 gaps is the engine's, not the host's
  for (const id of ["d0", "d1"]) await engineOptions(id, { decodeBaseMs: 1000 });
  await engineOptions("d0", { streamInterval: 8 });
});

describe("the decode step of an engine that streams several tokens an event", () => {
  it("is timed by the tokens its usage frames count, and its streams without one by the tokens an event it showed: the same step as a node streaming one a token", async () => {
    await freshPool();
    // round-robin D: d0 and d1 in turn
    const served = { d0: 0, d1: 0 } as Record<string, number>;
    for (let i = 0; i < 8; i++) served[await stream(i, true)]!++;
    expect(served).toEqual({ d0: 4, d1: 4 });
    // the finish reports travel in waitUntil: learned once every lease is released
    await settled();
    // 39 gaps in 5: the usage frame is not a token
    expect((await rates("d0")).tokensPerEvent).toBeGreaterThan(7);
    expect((await rates("d0")).tokensPerEvent).toBeLessThan(8);
    const withUsage = { d0: (await rates("d0")).decodeStepMs, d1: (await rates("d1")).decodeStepMs };
    // counted by events, d0's 39 gaps would be 6: a step ~6x d1's
    expect(withUsage.d0 / withUsage.d1).toBeGreaterThan(0.67);
    expect(withUsage.d0 / withUsage.d1).toBeLessThan(1.5);
    expect((await rates("d1")).tokensPerEvent).toBe(1);
    // Responses streams (an event a token, item and part events around them, a usage frame) to
    // both: timed by their usage, they say nothing of d0's chat streams' tokens an event
    for (let i = 0; i < 4; i++) {
      const res = await post("/v1/responses", { model: "sim-model", input: `responses ${i}`, max_output_tokens: OUT, stream: true });
      expect(res.status).toBe(200);
      expect(await res.text()).toContain("response.completed");
    }
    await settled();
    expect((await rates("d0")).tokensPerEvent).toBeGreaterThan(7);

    // the same without a usage frame: d0's events are counted as the tokens an event it showed
    await freshPool();
    // d0 shows its tokens an event in two streams with a usage frame, then streams without: twice
    // as many, so that counted by events alone its step would come out ~2x d1's
    for (let i = 0; i < 4; i++) await stream(100 + i, true);
    for (let i = 0; i < 8; i++) await stream(200 + i, false);
    await settled();
    const without = { d0: (await rates("d0")).decodeStepMs, d1: (await rates("d1")).decodeStepMs };
    expect(without.d0 / without.d1).toBeGreaterThan(0.67);
    expect(without.d0 / without.d1).toBeLessThan(1.5);
  });
});

describe("a stream of several choices", () => {
  it("teaches no decode step: its events interleave n sequences' tokens (a step learned from them would be 1/n of D's)", async () => {
    await resetState();
    for (const id of ["p0", "d1"]) await setMetrics(id, kv(0.1));
    await putNodes(
      [
        { id: "p0", role: "prefill" },
        { id: "d1", role: "decode" },
      ],
      // a prior far from d1's ~10 ms step: anything learned moves it
      { profile: { decodeStepMs: 1000 } },
    );
    await poll();
    const send = async (extra: Record<string, unknown>) => {
      const res = await post("/v1/chat/completions", { model: "sim-model", messages: [{ role: "user", content: "choices" }], max_tokens: 20, stream: true, ...extra });
      expect(res.status).toBe(200);
      expect(await res.text()).toContain("data: [DONE]");
    };
    for (let i = 0; i < 3; i++) await send({ n: 3, stream_options: { include_usage: true } });
    await settled();
    expect((await rates("d1")).decodeStepMs).toBe(1000);
    // one choice: learned
    await send({});
    await settled();
    expect((await rates("d1")).decodeStepMs).toBeLessThan(1000);
  });
});
