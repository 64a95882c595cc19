// The admission queue over real TCP, against the Worker in workerd: what happens to a request
// whose client leaves while it waits for a decode node. The client resets its socket
// (RawClient.leave); workerd cancels the request and aborts request.signal, as Cloudflare does
// for a client that disconnects, and the Worker's finish call takes it out of the queue at once
// (also tested in-process in test/worker/signals-admission.test.ts). A FIN-only close is not
// seen locally while nothing is written (docs/testing.md, "Clients that leave"): the request then
// keeps its place until admitted and ends within CLIENT_STALL_MS of it.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startMetricsFront, type MetricsFront } from "../support/metrics-front";
import { RawClient, expectReleased, sleep, startRig, until, type Rig } from "./lifecycle-harness";

const STALL_MS = 1000;
let rig: Rig;
const fronts: Record<string, MetricsFront> = {};
const busy = { mode: "override" as const, values: { kvUsage: 0.99, waiting: 0, running: 4 } };
const free = { mode: "override" as const, values: { kvUsage: 0.2, waiting: 0, running: 1 } };

/** A gauge summed over its series (pd_router_admission_queued has one per tier); NaN when absent. */
const gauge = async (name: string) => {
  const values = [...(await rig.metrics()).matchAll(new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, "gm"))].map((m) => Number(m[1]));
  return values.length ? values.reduce((a, b) => a + b, 0) : Number.NaN;
};

beforeAll(async () => {
  for (const id of ["p0", "d0"]) fronts[id] = await startMetricsFront();
  fronts.d0!.set(busy);
  rig = await startRig({
    engines: [
      { id: "p0", role: "prefill" },
      { id: "d0", role: "decode" },
    ],
    vars: { CLIENT_STALL_MS: STALL_MS, LEASE_TTL_MS: 3000 },
    document: (url) => {
      fronts.p0!.setTarget(url("p0"));
      fronts.d0!.setTarget(url("d0"));
      return {
        protocol: "vllm",
        policy: { prefill: "round_robin", decode: "round_robin" },
        health: { intervalMs: 60_000 },
        signals: { intervalMs: 1000, staleMs: 10_000 },
        admission: { queueMs: 30_000, maxQueued: 100 },
        nodes: [
          { id: "p0", url: fronts.p0!.url, role: "prefill" },
          { id: "d0", url: fronts.d0!.url, role: "decode" },
        ],
      };
    },
  });
}, 120000);

afterAll(async () => {
  await rig?.stop();
  await Promise.all(Object.values(fronts).map((f) => f.close()));
});

describe("a client that leaves while its request waits at the edge (over TCP)", () => {
  it("leaves the queue at once (request.signal): nothing sent upstream once the node frees; one `aborted` log line, no lease left", async () => {
    // a first routed request hands the document to the object, whose alarm then polls every second
    const warm = new RawClient(rig.port, { body: { model: "sim-model", messages: [{ role: "user", content: "warm" }], max_tokens: 2 } });
    await warm.waitEnded(20000);
    await until(
      "d0 busy",
      () => rig.metrics(),
      (t) => /pd_router_node_busy\{node="d0"\} 1/.test(t),
      10000,
    );

    const sentBefore = (await rig.engineStats()).d0!.requests.total;
    const id = `tcp-queued-leaver-${Date.now()}`;
    const client = new RawClient(rig.port, {
      body: { model: "sim-model", messages: [{ role: "user", content: "I will not wait" }], max_tokens: 200, stream: true },
      headers: { "x-request-id": id },
    });
    await until(
      "queued",
      () => gauge("pd_router_admission_queued"),
      (n) => n === 1,
      10000,
    );
    client.leave();
    // bounded by the poll interval's alarm at most (the queue is read through /metrics)
    await until(
      "left the queue",
      () => gauge("pd_router_admission_queued"),
      (n) => n === 0,
      STALL_MS + 4000,
    );
    // capacity frees: nobody is admitted for the client that left
    fronts.d0!.set(free);
    await until(
      "d0 free",
      () => rig.metrics(),
      (t) => /pd_router_node_busy\{node="d0"\} 0/.test(t),
      10000,
    );
    await expectReleased(rig, STALL_MS + 4000);
    await until(
      "one log line",
      async () => rig.requestLogs(id).length,
      (n) => n >= 1,
      5000,
    );
    await sleep(300);
    const logs = rig.requestLogs(id);
    expect(logs).toHaveLength(1);
    expect(logs[0]).toMatchObject({ status: 499, outcome: "aborted" });
    expect((await rig.engineStats()).d0!.requests.total).toBe(sentBefore);
  }, 60000);

  it("a waiting client that stays is answered once the node frees, nothing sent upstream before", async () => {
    fronts.d0!.set(busy);
    await until(
      "d0 busy",
      () => rig.metrics(),
      (t) => /pd_router_node_busy\{node="d0"\} 1/.test(t),
      10000,
    );
    const before = (await rig.engineStats()).d0!.requests.total;
    const client = new RawClient(rig.port, { body: { model: "sim-model", messages: [{ role: "user", content: "I wait" }], max_tokens: 4 } });
    await until(
      "queued",
      () => gauge("pd_router_admission_queued"),
      (n) => n === 1,
      10000,
    );
    expect((await rig.engineStats()).d0!.requests.total).toBe(before);
    fronts.d0!.set(free);
    expect(await client.waitEnded(15000)).toBe(true);
    const res = client.response();
    expect(res.status).toBe(200);
    expect(res.headers["server-timing"]).toMatch(/^queue;dur=\d+/);
    await expectReleased(rig, 3000);
  }, 60000);
});
