import { env, runInDurableObject } from "cloudflare:test";
import { afterEach, describe, expect, it, vi } from "vitest";
import { USAGE_DETAILS_SAMPLE } from "../../../src/observability/usage-details";
import { RoundRobinCursors } from "../../../src/state/cursors";
import { EngineSignals } from "../../../src/state/engine-signals";
import { NodeHistory } from "../../../src/state/node-history";
import { PrefillUsageDetails } from "../../../src/state/prefill-usage-details";
import { RouterStats } from "../../../src/state/router-stats";
import { clusterSnapshot, historyPoint } from "../../../src/state/snapshot";
import { openStorage, readKey, saveCursors, writeKey } from "../../../src/state/storage";
import { clusterView, decision, modules, reading, viewNode } from "./fixtures";
import { withoutFileEngines } from "../helpers";

withoutFileEngines();

// Shared state as operators see it (/metrics, the status page), assembled from the modules; and
// what the object keeps in storage.

afterEach(() => vi.restoreAllMocks());

const SETTINGS = { intervalMs: 5_000, staleMs: 15_000, kvBusy: 0.9, queueBusy: 8 };

describe("the snapshot", () => {
  it("before any document: no nodes, the counters as they are", () => {
    const s = clusterSnapshot(null, modules(), 7, true);
    expect(s).toMatchObject({ version: null, nodes: [], leases: 0, expiredLeases: 0, history: [], now: 7 });
    expect(s.prefix).toEqual({ prefillEntries: 0, decodeEntries: 0, maxEntries: 1_000, lookedUpBlocks: 0, matchedBlocks: 0 });
    expect(s.admission).toMatchObject({ queued: 0, rejected: [] });
  });

  it("each node: its roles, health, leases' load, engine signals, usage details and prefix feedback", () => {
    const m = modules();
    const view = clusterView([viewNode("p0", "prefill"), viewNode("b0", "both", { group: "g" })]);
    m.health.sync(new Set(["p0", "b0"]));
    m.leases.take("a", { prefill: "p0", decode: "b0", tokens: 300, prefillTokens: 120, expiresAt: 1e9, route: "r", fallbacks: { prefill: [], decode: [] }, model: "m" });
    m.signals.record("b0", reading({ kvUsage: 0.95 }), 0);
    m.signals.record("p0", reading({ kvUsage: 0.95 }), 0);
    const s = clusterSnapshot(view, m, 1_000, false);
    expect(s.version).toBe("v1");
    expect(s.leases).toBe(1);
    const [p0, b0] = s.nodes;
    expect(p0).toMatchObject({
      id: "p0",
      roles: ["prefill"],
      group: null,
      healthy: true,
      breaker: "closed",
      inflight: { prefill: 1, prefillTokens: 120, decode: 0 },
      usageDetails: "unknown",
    });
    expect(b0).toMatchObject({ id: "b0", roles: ["prefill", "decode"], group: "g", inflight: { decode: 1, tokens: 300 }, requestsTotal: { decode: 1 } });
    expect(b0?.prefix).toEqual({ predictedTokens: 0, cachedTokens: 0, cacheLost: 0, charsPerToken: 4 });
    // only a node that decodes can be busy
    expect(b0?.signals).toMatchObject({ kvUsage: 0.95, at: 0, ageMs: 1_000, busy: true });
    expect(p0?.signals?.busy).toBe(false);
  });

  it("the history only when asked for (the status page), not for /metrics", () => {
    const m = modules();
    m.history.add({ t: 0, nodes: [] });
    const view = clusterView([viewNode("d0", "decode")]);
    expect(clusterSnapshot(view, m, 10, false).history).toEqual([]);
    expect(clusterSnapshot(view, m, 10, true).history).toHaveLength(1);
  });
});

describe("a node's engine signals on the status page", () => {
  it("what the engine last said whatever its age, and the projection only while fresh", () => {
    const s = new EngineSignals();
    expect(s.status("d0", true, 0, SETTINGS)).toBeNull();
    s.record("d0", reading({ kvUsage: 0.5, waiting: 2, kvCapacityTokens: 1_000 }), 0);
    s.dispatched("d0", 100);
    expect(s.status("d0", true, 10, SETTINGS)).toMatchObject({ kvUsage: 0.5, waiting: 2, ageMs: 10, busy: false });
    expect(s.status("d0", true, 10, SETTINGS)?.projected?.kvUsage).toBeCloseTo(0.6);
    expect(s.status("d0", true, 10, SETTINGS)?.projected?.queue).toBe(3);
    expect(s.status("d0", true, 20_000, SETTINGS)).toMatchObject({ kvUsage: 0.5, ageMs: 20_000, projected: null, busy: false });
  });

  it("a decode lease that fails over leaves its tokens on the node it moved to", () => {
    const s = new EngineSignals();
    for (const n of ["d0", "d1"]) s.record(n, reading({ kvUsage: 0.5, kvCapacityTokens: 1_000 }), 0);
    s.dispatched("d0", 200);
    s.moved("d0", "d1", 200);
    expect(s.view("d0", 0, 15_000)?.kvUsage).toBeCloseTo(0.5);
    expect(s.view("d1", 0, 15_000)).toMatchObject({ kvCapacityTokens: 1_000, ageMs: 0 });
    expect(s.view("d1", 0, 15_000)?.kvUsage).toBeCloseTo(0.7);
  });
});

describe("the status page's history", () => {
  it("a point a second at most, of every node's in-flight requests, reported KV use and queue, and requests routed so far", () => {
    const m = modules();
    const view = clusterView([viewNode("p0", "prefill"), viewNode("d0", "decode")]);
    m.leases.take("a", { prefill: "p0", decode: "d0", tokens: 1, expiresAt: 1e9, route: "r", fallbacks: { prefill: [], decode: [] }, model: "m" });
    m.signals.record("d0", reading({ kvUsage: 0.4, waiting: 3 }), 0);
    m.stats.countRouted(decision("p0", "d0"));
    expect(historyPoint(view, 1_000, m)).toEqual({
      t: 1_000,
      routed: 1,
      nodes: [
        { node: "p0", inflight: 1, kvUsage: null, queue: null, requests: 1 },
        { node: "d0", inflight: 1, kvUsage: 0.4, queue: 3, requests: 1 },
      ],
    });
    const h = new NodeHistory(60_000, 10, 1_000);
    expect([h.due(1_000), h.due(1_500), h.due(2_000), h.due(2_999)]).toEqual([true, false, true, false]);
  });
});

describe("the counters", () => {
  it("a routed request counts each role's rule and how it is served; answered legs their latency; an expired lease a 499", () => {
    const s = new RouterStats();
    s.countRouted(decision("d0", "d0", { mode: "local", reason: "cached", prefillRule: "local_prefill" }));
    s.observeLeg("prefill", { node: "p0", outcome: "ok", ms: 20 });
    s.observeLeg("decode", { node: "d0", outcome: "ok", ms: 30 });
    s.observeLeg("decode", { node: "d0", outcome: "failure", ms: 30 });
    s.observeLeg("decode", { node: "d0", outcome: "ok" });
    s.countExpired("/v1/completions");
    expect(s.decisions()).toEqual([
      { role: "prefill", rule: "local_prefill", count: 1 },
      { role: "decode", rule: "round_robin", count: 1 },
    ]);
    expect(s.disagg()).toEqual([{ mode: "local", reason: "cached", count: 1 }]);
    expect([s.latency.prefill.count, s.latency.ttfb.count]).toEqual([1, 1]);
    expect(s.latency.ttfb.sum).toBeCloseTo(0.03);
    expect(s.expiredLeases).toBe(1);
    expect(s.requests()).toEqual([{ route: "/v1/completions", status: 499, count: 1 }]);
  });

  it("a prefill node that never reports prompt_tokens_details, though its /metrics shows prefix-cache hits, is named once in the log", () => {
    const warn = vi.spyOn(console, "warn").mockImplementation(() => undefined);
    const u = new PrefillUsageDetails();
    u.prefixHits("p0", 0);
    u.prefixHits("p0", 4096);
    for (let i = 0; i < USAGE_DETAILS_SAMPLE + 5; i++) u.note("p0", false);
    u.note("p1", true);
    expect([u.verdict("p0"), u.verdict("p1"), u.verdict("p2")]).toEqual(["missing", "reported", "unknown"]);
    expect(warn).toHaveBeenCalledOnce();
    expect(JSON.parse(String(warn.mock.calls[0]?.[0]))).toMatchObject({ event: "prefill_usage_details_missing", node: "p0" });
  });
});

/** Runs `fn` with the storage of a ClusterState object nobody else uses (typed loosely: the stub's RPC types are too deep). */
async function withStorage<T>(name: string, fn: (sql: SqlStorage) => T): Promise<T> {
  const stub = env.CLUSTER_STATE.get(env.CLUSTER_STATE.idFromName(name)) as unknown;
  const run = runInDurableObject as unknown as (s: unknown, cb: (instance: unknown, state: DurableObjectState) => T) => Promise<T>;
  return run(stub, (_, state) => fn(state.storage.sql));
}

describe("the object's storage", () => {
  it("cursors: written only when they moved, and a new instance reads them back", async () => {
    const [unmoved, written, restored] = await withStorage("storage-cursors", (sql) => {
      const cursors = new RoundRobinCursors();
      openStorage(sql, cursors);
      saveCursors(sql, cursors);
      const unmoved = readKey(sql, "cursors");
      cursors.set({ prefill: 3, decode: 0 });
      saveCursors(sql, cursors);
      const written = readKey(sql, "cursors");
      const again = new RoundRobinCursors();
      openStorage(sql, again);
      return [unmoved, written, { ...again, unsaved: again.unsaved() }];
    });
    expect(unmoved).toBeNull();
    expect(JSON.parse(written!)).toEqual({ prefill: 3, decode: 0 });
    expect(restored).toEqual({ prefill: 3, decode: 0, unsaved: null });
  });

  it("the cluster view and the last good document, each under its key", async () => {
    const view = clusterView([viewNode("d0", "decode")]);
    const [before, opened, lastGood] = await withStorage("storage-keys", (sql) => {
      const before = openStorage(sql, new RoundRobinCursors());
      writeKey(sql, "cluster", JSON.stringify(view));
      writeKey(sql, "last_good_document", "{}");
      writeKey(sql, "last_good_document", '{"nodes":[]}');
      return [before, openStorage(sql, new RoundRobinCursors()), readKey(sql, "last_good_document")];
    });
    expect(before).toBeNull();
    expect(opened).toEqual(view);
    expect(lastGood).toBe('{"nodes":[]}');
  });
});
