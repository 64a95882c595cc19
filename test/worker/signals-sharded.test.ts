import { env, runDurableObjectAlarm, runInDurableObject, SELF } from "cloudflare:test";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { pollerCount } from "../../src/config/plan";
import { readClusterStatus } from "../../src/observability/metrics";
import { assignPollers, NewestReadings, pollerName } from "../../src/state/poller-shards";
import { chatBody, explain, frontStats, kv, nodeUrl, post, resetEngines, resetState, setMetrics, snapshot, stub, useSignalsRig, waitFor } from "./signals-helpers";

useSignalsRig();

// Sharded polling (issue 24 item 2, docs/scaling.md): past `signals.shardAbove` nodes the pool's
// object hands its /metrics polls to SignalPoller objects, one per `signals.nodesPerPoller` nodes,
// which push compact readings back by RPC. Here the threshold is forced down: 12 nodes, shard above
// 4, 4 a poller: 3 pollers. The nodes share the rig's four fronted /metrics servers (p0, d0, d1,
// c0): d0 and d1 are the decode nodes routing is asked about; the rest are prefill nodes.

const FILLERS = Array.from({ length: 9 }, (_, i) => ({ id: `f${i}`, role: "prefill" as const, front: i % 2 ? "p0" : "c0" }));
const NODES = [
  { id: "p0", role: "prefill" as const, front: "p0" },
  { id: "d0", role: "decode" as const, front: "d0" },
  { id: "d1", role: "decode" as const, front: "d1" },
  ...FILLERS,
];

/** a poller's first alarm runs at once on its assignment; a starved machine may hold it for seconds */
const FIRST_READING_MS = 15_000;

async function putSharded(signals: Record<string, number>): Promise<void> {
  const doc = {
    protocol: "vllm",
    policy: { prefill: "round_robin", decode: "round_robin" },
    health: { intervalMs: 600_000 },
    signals: { shardAbove: 4, nodesPerPoller: 4, ...signals },
    nodes: NODES.map((n) => ({ id: n.id, role: n.role, url: nodeUrl(n.front) })),
  };
  await env.NODES.put("nodes", JSON.stringify(doc));
  // a dry run hands the document to the pool's object, which assigns its pollers at once
  await (await post("/v1/route", chatBody("sync"))).arrayBuffer();
}

const poller = (i: number) => env.SIGNAL_POLLER.get(env.SIGNAL_POLLER.idFromName(pollerName(stub().id.toString(), i)));
const signalsOf = async (id: string) => (await snapshot()).nodes.find((n) => n.id === id)!.signals;
/** waits for the node's first reading from its poller, showing `kvUsage` */
const firstReading = (id: string, kvUsage: number) =>
  waitFor(
    `${id}'s reading`,
    () => signalsOf(id),
    (s) => s?.kvUsage === kvUsage,
    FIRST_READING_MS,
  );
const totalMetricsRequests = async () => {
  let sum = 0;
  for (const id of ["p0", "d0", "d1", "c0"]) sum += (await frontStats(id)).metricsRequests;
  return sum;
};
/** stops the pollers a test left polling, so the next starts from none */
const stopPollers = async () => {
  for (let i = 0; i < 3; i++) await poller(i).stop();
};

beforeEach(async () => {
  await resetState();
  // the pool's object forgets its pollers too: each test assigns them afresh
  await (runInDurableObject as unknown as (s: unknown, cb: (instance: any) => void) => Promise<void>)(stub(), (instance) => {
    instance.pollers.clear();
  });
  await resetEngines();
  for (const id of ["p0", "d0", "d1", "c0"]) await setMetrics(id, kv(0.1));
});

afterEach(async () => {
  vi.restoreAllMocks();
  await stopPollers();
});

describe("which poller polls which node", () => {
  it("more nodes than shardAbove: one poller a nodesPerPoller; at or below it: none (the object polls)", () => {
    expect(pollerCount(256, {})).toBe(0);
    expect(pollerCount(257, {})).toBe(3);
    expect(pollerCount(512, {})).toBe(4);
    expect(pollerCount(12, { shardAbove: 4, nodesPerPoller: 4 })).toBe(3);
  });

  it("rendezvous: every node in exactly one poller; a new node moves no other; a new poller takes nodes only to itself", () => {
    const nodes = Array.from({ length: 512 }, (_, i) => ({ id: `n${i}` }));
    const four = assignPollers(nodes, 4);
    expect(
      four
        .flat()
        .map((n) => n.id)
        .sort(),
    ).toEqual(nodes.map((n) => n.id).sort());
    for (const shard of four) expect(shard.length).toBeGreaterThan(90);
    const home = (shards: Array<Array<{ id: string }>>) => new Map(shards.flatMap((s, i) => s.map((n) => [n.id, i] as const)));
    const before = home(four);
    const plusNode = home(assignPollers([...nodes, { id: "n512" }], 4));
    for (const [id, i] of before) expect(plusNode.get(id)).toBe(i);
    const five = home(assignPollers(nodes, 5));
    for (const [id, i] of before) expect([i, 4]).toContain(five.get(id));
  });

  it("a reading is taken only when newer (at, then seq) than the node's newest", () => {
    const newest = new NewestReadings();
    expect(newest.take({ node: "a", at: 100, seq: 5 })).toBe(true);
    expect(newest.take({ node: "a", at: 99, seq: 50 })).toBe(false);
    expect(newest.take({ node: "a", at: 100, seq: 5 })).toBe(false);
    expect(newest.take({ node: "a", at: 100, seq: 6 })).toBe(true);
    expect(newest.take({ node: "a", at: 101, seq: 1 })).toBe(true);
    expect(newest.take({ node: "b", at: 1, seq: 1 })).toBe(true);
  });
});

describe("readings from poller objects", () => {
  it("arrive from the pollers and drive routing; the pool's own alarm polls no /metrics", async () => {
    await setMetrics("d0", kv(0.95));
    await setMetrics("d1", kv(0.2, { waiting: 1 }));
    const before = await totalMetricsRequests();
    await putSharded({ intervalMs: 600_000, staleMs: 1_200_000 });
    // each poller's first alarm runs at once on its assignment
    await waitFor("every node's reading", snapshot, (s) => s.nodes.every((n) => n.signals !== null), FIRST_READING_MS);
    expect(await totalMetricsRequests()).toBe(before + NODES.length);
    // the status data names the pollers, their nodes and how long since each pushed
    const pollers = (await snapshot()).pollers!;
    expect(pollers.map((p) => p.poller)).toEqual([0, 1, 2]);
    expect(pollers.reduce((sum, p) => sum + p.nodes, 0)).toBe(NODES.length);
    expect(pollers.every((p) => p.silentMs < 5_000)).toBe(true);
    // what /status.json and the status page get: the same pollers, named with their pool
    const status = (await readClusterStatus(env as never)).snapshot;
    expect(status.pollers!.map((p) => [p.pool, p.poller, p.nodes])).toEqual(pollers.map((p) => ["cluster", p.poller, p.nodes]));

    const route = await explain(chatBody("explain"));
    const byId = Object.fromEntries(route.candidates.decode.map((c: any) => [c.id, c]));
    expect(byId.d0).toMatchObject({ kvUsage: 0.95, busy: true, skipped: "busy" });
    expect(byId.d1).toMatchObject({ kvUsage: 0.2, queue: 1, busy: false });
    expect(route.decode.id).toBe("d1");

    // the pool's alarm, sharded, only watches its pollers: no /metrics request of its own
    await runDurableObjectAlarm(stub() as never);
    expect(await totalMetricsRequests()).toBe(before + NODES.length);
    // the reading's age, as before: /metrics and the status page's data
    const text = await (await SELF.fetch("http://router/metrics")).text();
    expect(text).toMatch(/pd_router_node_signals_age_seconds\{node="d1"\} [0-9.]+/);
    expect((await signalsOf("d1"))!.ageMs).toBeGreaterThanOrEqual(0);
  });

  it("a new reading replaces the last at the poller's next run", async () => {
    await putSharded({ intervalMs: 600_000, staleMs: 1_200_000 });
    await firstReading("d1", 0.1);
    await setMetrics("d1", kv(0.6));
    const home = assignPollers(NODES, 3).findIndex((shard) => shard.some((n) => n.id === "d1"));
    await runDurableObjectAlarm(poller(home) as never);
    expect((await signalsOf("d1"))!.kvUsage).toBe(0.6);
  });
});

describe("stale readings are ignored", () => {
  it("a push for another document version, or not newer than the node's newest (at, seq), changes nothing", async () => {
    await setMetrics("d1", kv(0.2));
    await putSharded({ intervalMs: 600_000, staleMs: 1_200_000 });
    const held = await firstReading("d1", 0.2);
    const version = (await snapshot()).version!;
    const reading = { kvUsage: 0.7, waiting: 0, running: 1, kvCapacityTokens: null };

    // a poller still on the previous document
    expect(await stub().pushReadings({ version: `${version}-old`, poller: 0, readings: [{ node: "d1", reading, at: held!.at + 10, seq: 1e9 }] })).toBe("stale_version");
    // older than the newest held; as old, with a seq not above the one taken (the poller's first reading was seq >= 1)
    expect(await stub().pushReadings({ version, poller: 0, readings: [{ node: "d1", reading, at: held!.at - 1_000, seq: 1e9 }] })).toBe("ok");
    expect(await stub().pushReadings({ version, poller: 0, readings: [{ node: "d1", reading, at: held!.at, seq: 0 }] })).toBe("ok");
    expect(await signalsOf("d1")).toMatchObject({ kvUsage: 0.2, at: held!.at });

    // newer: taken
    expect(await stub().pushReadings({ version, poller: 0, readings: [{ node: "d1", reading, at: held!.at + 1, seq: 0 }] })).toBe("ok");
    expect(await signalsOf("d1")).toMatchObject({ kvUsage: 0.7 });
  });
});

describe("a poller that dies is replaced", () => {
  // The death modelled: the poller lost its assignment and its alarm — what a poller looks like
  // after its alarm failed past Cloudflare's retries, or after its storage was lost: it still
  // answers calls, but polls no more. (Its own stop() puts it in that state.) Real time, at the
  // shortest interval the document allows: 1 s polls, so silent for 3 s is dead.
  it("silent for 3 intervals: the pool's object assigns it again, logs it, and its nodes' readings resume", { timeout: 60_000 }, async () => {
    const warn = vi.spyOn(console, "warn");
    await setMetrics("d1", kv(0.2));
    await putSharded({ intervalMs: 1_000, staleMs: 60_000 });
    await firstReading("d1", 0.2);
    const home = assignPollers(NODES, 3).findIndex((shard) => shard.some((n) => n.id === "d1"));

    await poller(home).stop();
    await setMetrics("d1", kv(0.45));
    // the other pollers go on: a node they poll sees a new reading while d1 does not
    const other = NODES.find((n) => n.front !== "d1" && !assignPollers(NODES, 3)[home]!.some((m) => m.id === n.id))!;
    const otherAt = (await signalsOf(other.id))!.at;
    await waitFor(
      `${other.id}'s next reading`,
      () => signalsOf(other.id),
      (s) => s!.at > otherAt,
      8_000,
    );
    expect((await signalsOf("d1"))!.kvUsage).toBe(0.2);

    // the pool's alarm (every interval while sharded) finds it silent and assigns it again
    await waitFor(
      "d1's reading after the poller is replaced",
      () => signalsOf("d1"),
      (s) => s?.kvUsage === 0.45,
      20_000,
    );
    const silent = warn.mock.calls.map((c) => String(c[0])).filter((line) => line.includes('"event":"signal_poller_silent"'));
    expect(silent.some((line) => line.includes(`"poller":${home}`))).toBe(true);
  });
});
