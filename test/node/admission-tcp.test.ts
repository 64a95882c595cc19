// The admission queue over real TCP, against the Worker in workerd: what happens to a request
// whose client leaves while it waits for a decode node. Measured here: local workerd delivers no
// request.signal to a handler awaiting a Durable Object call when its client disconnects (as for
// any departure before the response starts; docs/lifecycle.md "Clients that leave"), so the router cannot
// take it out of the queue at once there. On Cloudflare the signal fires and the Worker's finish
// call takes it out (tested in-process in test/worker/signals-admission.test.ts). Either way the
// request ends exactly once, its lease released, within CLIENT_STALL_MS of being admitted.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startMetricsFront, type MetricsFront } from "../support/metrics-front";
import { RawClient, expectEnginesIdle, expectReleased, sleep, startRig, until, type Rig } from "./lifecycle-harness";

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
  it("local workerd: no signal, so it waits until admitted, then ends within CLIENT_STALL_MS; one log line, no lease left", async () => {
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
    // measured: the handler is not told, so the request keeps its place
    await sleep(1500);
    expect(await gauge("pd_router_admission_queued")).toBe(1);
    expect((await rig.engineStats()).d0!.requests.total).toBe(sentBefore);

    fronts.d0!.set(free);
    await until(
      "admitted",
      () => gauge("pd_router_admission_queued"),
      (n) => n === 0,
      10000,
    );
    await expectReleased(rig, STALL_MS + 4000);
    await expectEnginesIdle(rig, 3000);
    await until(
      "one log line",
      async () => rig.requestLogs(id).length,
      (n) => n >= 1,
      5000,
    );
    await sleep(300);
    const logs = rig.requestLogs(id);
    expect(logs).toHaveLength(1);
    expect(logs[0]).toMatchObject({ status: 499 });
    expect(logs[0]!.queueMs).toBeGreaterThanOrEqual(1000);
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
