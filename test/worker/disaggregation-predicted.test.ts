import { runInDurableObject } from "cloudflare:test";
import { beforeEach, describe, expect, it } from "vitest";
import { completionsTo, explain, kv, poll, post, putNodes, resetEngines, resetState, sendChat, setMetrics, signalsRig, snapshot, stub, waitFor } from "./signals-helpers";
import { conversations } from "../support/conversation";

// Predicted disaggregation through the Worker (SPEC 9, issue 23 item 2): what the engines' own
// figures (steered /metrics) and the learned rates make of a request — which D, local or not —
// and how a node made slower is learned.

/** A conversation of 6 prefix blocks (~3,100 tokens), apart from other runs' */
const conversation = conversations(Math.random().toString(36).slice(2, 8));
// the engine queue is the prediction's to weigh, not the guard's: queueBusy out of the way
const signals = { intervalMs: 600_000, staleMs: 1_200_000, queueBusy: 1000 };
const predicted = (decode = "affinity") => ({ policy: { prefill: "affinity", decode, disaggregation: "predicted" }, signals });

const byId = (list: any[]) => Object.fromEntries(list.map((c) => [c.id, c]));

/** Each test starts from the profile's rates: what an earlier test taught the object is forgotten. */
async function forgetRates(): Promise<void> {
  const run = runInDurableObject as unknown as (s: unknown, cb: (instance: any) => void) => Promise<void>;
  await run(stub() as unknown, (instance) => {
    instance.rates.clear();
    instance.precision.clear();
  });
}

beforeEach(async () => {
  await resetState();
  await forgetRates();
  await resetEngines();
  for (const id of ["p0", "d0", "d1", "c0"]) await setMetrics(id, kv(0.1, { capacityTokens: 100_000 }));
});

describe("predicted: the D predicted soonest, not the one holding the most of the prompt", () => {
  it("a warm D with a long queue of prefill work is passed over for a cold one predicted faster", async () => {
    await putNodes(
      [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
        { id: "d1", role: "decode" },
      ],
      predicted("cache_aware"),
    );
    await poll();
    const turn = conversation("queued-d");
    const first = await sendChat(turn(1));
    const warm = first.d!;
    const cold = warm === "d0" ? "d1" : "d0";
    const idle = await explain(turn(2));
    expect(idle).toMatchObject({ reason: "predicted", decode: { id: warm } });

    // the warm D's engine has 40 requests waiting: its prefill queue delays this turn's first token
    await setMetrics(warm, kv(0.1, { waiting: 40, capacityTokens: 100_000 }));
    await poll();
    const route = await explain(turn(2));
    expect(route).toMatchObject({ mode: "disaggregated", reason: "predicted", decode: { id: cold, rule: "predicted" } });
    const d = byId(route.candidates.decode);
    // it holds more of the prompt, and is predicted slower
    expect(d[warm].uncachedTokens).toBeLessThan(d[cold].uncachedTokens);
    expect(d[warm].predictedTtftMs).toBeGreaterThan(d[cold].predictedTtftMs);
    expect(route.predictedTtftMs).toBeCloseTo(d[cold].predictedTtftMs, 0);
    expect((await sendChat(turn(2))).d).toBe(cold);
  });
});

describe("predicted: a local prefill needs KV room for the whole prompt", () => {
  it("with P queued, D prefills alone while it has room; without room for the whole prompt it gets the KV from P", async () => {
    await setMetrics("p0", kv(0.1, { waiting: 40, capacityTokens: 100_000 }));
    await putNodes(
      [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
      ],
      predicted(),
    );
    await poll();
    const cold = conversation("kv-room")(1);
    const roomy = await explain(cold);
    expect(roomy).toMatchObject({ mode: "local", reason: "predicted", prefill: { id: "d0", rule: "local_prefill" } });
    expect(byId(roomy.candidates.decode).d0.localTtftMs).toBeGreaterThan(0);

    // 3,000 tokens of KV: the ~3,100-token prompt cannot be prefilled there (the KV guard still lets D take it from P)
    await setMetrics("d0", kv(0.1, { capacityTokens: 3000 }));
    await poll();
    const tight = await explain(cold);
    expect(tight).toMatchObject({ mode: "disaggregated", reason: "predicted", prefill: { id: "p0" }, decode: { id: "d0" } });
    expect(byId(tight.candidates.decode).d0.localTtftMs).toBeNull();
    expect(await sendChat(cold)).toMatchObject({ mode: "disaggregated", p: "p0", d: "d0" });
    expect((await completionsTo("d0")).at(-1)?.kv_transfer_params).toMatchObject({ do_remote_prefill: true });
  });
});

describe("learned rates", () => {
  it("a prefill node made slower is learned (whatever the disaggregation), and predicted disaggregation then prefills on D instead", async () => {
    const nodes = [
      { id: "p0", role: "prefill" as const },
      { id: "d0", role: "decode" as const },
    ];
    // learned under `always`: every request goes through p0
    await putNodes(nodes, { policy: { prefill: "affinity", decode: "affinity" }, signals });
    await poll();
    const tokensPerS = async () => (await snapshot()).nodes.find((n) => n.id === "p0")!.rates!.prefillTokensPerS;
    const ask = (i: number) => conversation(`rate-${i}`)(1);
    for (let i = 0; i < 5; i++) await sendChat(ask(i));
    const before = await waitFor("p0's rate learned", tokensPerS, (v) => v !== 10_000);
    // p0 now takes a second longer to answer each prefill
    const res = await fetch(`${signalsRig().simControlUrl}/engines/p0/fault`, { method: "POST", body: JSON.stringify({ mode: "slow", delayMs: 1000, count: 4 }) });
    expect(res.ok).toBe(true);
    for (let i = 5; i < 9; i++) expect((await sendChat(ask(i))).p).toBe("p0");
    const after = await waitFor("p0's slowness learned", tokensPerS, (v) => v < before / 2);
    expect(after).toBeLessThan(before / 2);
    // predicted: /v1/route shows the slow rate, and d0 (at its profile's rate) prefills the next cold prompt itself
    await putNodes(nodes, predicted());
    const route = await explain(conversation("after-slow")(1));
    expect(byId(route.candidates.prefill).p0.prefillMsPerToken).toBeGreaterThan((1.5 * 1000) / before);
    expect(route).toMatchObject({ mode: "local", reason: "predicted", decode: { id: "d0" } });
  });

  it("a stream's pace teaches D's decode step (the gaps between its events, as the relay passes them)", async () => {
    await putNodes(
      [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
      ],
      // a prior far from the simulator's steps (a few real ms at its time scale)
      { ...predicted(), profile: { decodeStepMs: 5000 } },
    );
    await poll();
    const step = async () => (await snapshot()).nodes.find((n) => n.id === "d0")!.rates!.decodeStepMs;
    expect(await step()).toBe(5000);
    for (let i = 0; i < 4; i++) {
      const res = await post("/v1/chat/completions", { ...conversation(`pace-${i}`)(1), max_tokens: 40, stream: true });
      expect(res.status).toBe(200);
      await res.text();
    }
    // the finish reports travel in waitUntil
    expect(await waitFor("decode step learned", step, (v) => v < 2500)).toBeLessThan(2500);
  });
});
