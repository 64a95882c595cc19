import { beforeEach, describe, expect, it } from "vitest";
import { completionsTo, explain, kv, poll, putNodes, resetEngines, resetState, sendChat, setMetrics, useSignalsRig } from "./signals-helpers";
import { conversations } from "../support/conversation";
import { seededRandom } from "../support/seeded";

useSignalsRig();

// Conditional disaggregation and what the engines say about themselves (SPEC 8): a D that is busy
// (or that this request would make busy) gets no local prefill; a P whose engine queue is at
// queueBusy is skipped by prefilling on D (Dynamo's prefill-load bypass), unless D is busy.

const PD = [
  { id: "p0", role: "prefill" as const },
  { id: "d0", role: "decode" as const },
];
const conversation = conversations(seededRandom(12)().toString(36).slice(2, 8));
const policy = { prefill: "affinity", decode: "affinity", disaggregation: "conditional" };

beforeEach(async () => {
  await resetState();
  await resetEngines();
  for (const id of ["p0", "d0", "d1", "c0"]) await setMetrics(id, kv(0.1, { capacityTokens: 100_000 }));
});

describe("a busy D is not given a local prefill", () => {
  it("a warm turn whose tokens would take D's KV to kvBusy goes P then D (decode_busy)", async () => {
    await putNodes(PD, { policy });
    await poll();
    const turn = conversation("decode-busy");
    expect((await sendChat(turn(1))).mode).toBe("disaggregated");
    const warm = turn(2);
    expect(await explain(warm)).toMatchObject({ mode: "local", reason: "cached" });

    // 0.89 used of 1,000 tokens: the turn's uncached tokens (a few dozen) reach 0.9
    await setMetrics("d0", kv(0.89, { capacityTokens: 1000 }));
    await poll();
    const route = await explain(warm);
    expect(route).toMatchObject({ mode: "disaggregated", reason: "decode_busy", decode: { id: "d0" } });
    expect(route.candidates.decode[0]).toMatchObject({ id: "d0", kvUsage: expect.closeTo(0.89, 2), busy: false });
    const before = (await completionsTo("p0")).length;
    expect((await sendChat(warm)).mode).toBe("disaggregated");
    expect((await completionsTo("p0")).length).toBe(before + 1);
    expect((await completionsTo("d0")).at(-1)?.kv_transfer_params).toMatchObject({ do_remote_prefill: true });
  });
});

describe("a busy P: D prefills the request itself (prefill_busy)", () => {
  it("a cold prompt whose P has a queue at queueBusy goes to D alone; P is shown busy and gets nothing", async () => {
    await setMetrics("p0", kv(0.2, { waiting: 9, capacityTokens: 100_000 }));
    await putNodes(PD, { policy });
    await poll();
    const cold = conversation("prefill-busy")(1);
    const route = await explain(cold);
    expect(route).toMatchObject({ mode: "local", reason: "prefill_busy", prefill: { id: "d0", rule: "local_prefill" } });
    expect(route.candidates.prefill.find((c: any) => c.id === "p0")).toMatchObject({ queue: 9, busy: true });
    expect((await sendChat(cold)).mode).toBe("local");
    expect(await completionsTo("p0")).toEqual([]);
    expect((await completionsTo("d0")).at(-1)).not.toHaveProperty("kv_transfer_params");
  });

  it("…unless D has no room for the prompt either: it waits at the edge, since D holds the whole prompt whoever prefills it", async () => {
    await setMetrics("p0", kv(0.2, { waiting: 9, capacityTokens: 100_000 }));
    // 0.7 used of 10,000 tokens: not busy, but the prompt's ~3,100 tokens would take it past 0.9
    await setMetrics("d0", kv(0.7, { capacityTokens: 10_000 }));
    await putNodes(PD, { policy });
    await poll();
    const cold = conversation("both-busy")(1);
    const route = await explain(cold);
    expect(route.admission).toEqual({ wait: true, queued: 0 });
    expect(route.candidates.decode[0]).toMatchObject({ id: "d0", busy: true });
    // room on D again: P is still busy, so D prefills it alone
    await setMetrics("d0", kv(0.2, { capacityTokens: 100_000 }));
    await poll();
    expect(await explain(cold)).toMatchObject({ mode: "local", reason: "prefill_busy", admission: { wait: false } });
  });
});
