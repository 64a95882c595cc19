import { describe, expect, it } from "vitest";
import { clusterMetrics, mergeSnapshots } from "../../src/observability/metrics";
import type { ClusterSnapshot, Histogram } from "../../src/state/types";
import { withoutFileEngines } from "./helpers";

withoutFileEngines();

// With several node pools, /metrics and the status page add up one object per pool plus the whole
// cluster's (which also counts refused requests): counters with the same labels are summed.

const histogram = (counts: number[], sum: number): Histogram => ({ bounds: [0.1, 1], counts, sum, count: counts.reduce((a, b) => a + b, 0) });

function snapshot(over: Partial<ClusterSnapshot>): ClusterSnapshot {
  return {
    version: "v1",
    nodes: [],
    leases: 0,
    expiredLeases: 0,
    requests: [],
    decisions: [],
    disagg: [],
    prefix: { prefillEntries: 0, decodeEntries: 0, maxEntries: 0, lookedUpBlocks: 0, matchedBlocks: 0 },
    latency: { ttfb: histogram([0, 0], 0), prefill: histogram([0, 0], 0) },
    admission: { queued: 0, wait: histogram([0, 0], 0), rejected: [] },
    history: [],
    now: 0,
    ...over,
  };
}

describe("the pools' snapshots as one", () => {
  const whole = snapshot({ requests: [{ route: "/v1/chat/completions", status: 400, count: 2 }], now: 5 });
  const a = snapshot({
    leases: 1,
    requests: [
      { route: "/v1/chat/completions", status: 200, count: 3 },
      { route: "/v1/chat/completions", status: 400, count: 1 },
    ],
    decisions: [{ role: "decode", rule: "affinity", count: 3 }],
    disagg: [{ mode: "disaggregated", reason: "always", count: 3 }],
    prefix: { prefillEntries: 10, decodeEntries: 4, maxEntries: 100, lookedUpBlocks: 8, matchedBlocks: 2 },
    latency: { ttfb: histogram([1, 2], 1.5), prefill: histogram([3, 0], 0.2) },
    admission: { queued: 1, wait: histogram([1, 0], 0.05), rejected: [{ reason: "timeout", count: 1 }] },
    pollers: [
      { poller: 0, nodes: 140, silentMs: 100, pool: "pool:m1" },
      { poller: 1, nodes: 120, silentMs: 9_000, pool: "pool:m1" },
    ],
    now: 7,
  });
  const b = snapshot({
    leases: 2,
    requests: [{ route: "/v1/chat/completions", status: 200, count: 4 }],
    decisions: [
      { role: "decode", rule: "affinity", count: 1 },
      { role: "prefill", rule: "sticky", count: 2 },
    ],
    disagg: [{ mode: "local", reason: "cached", count: 1 }],
    prefix: { prefillEntries: 5, decodeEntries: 6, maxEntries: 100, lookedUpBlocks: 4, matchedBlocks: 4 },
    latency: { ttfb: histogram([0, 1], 0.5), prefill: histogram([1, 1], 0.6) },
    admission: { queued: 0, wait: histogram([0, 1], 0.5), rejected: [{ reason: "timeout", count: 2 }] },
    pollers: [{ poller: 0, nodes: 130, silentMs: 400, pool: "pool:m2" }],
    now: 6,
  });
  const merged = mergeSnapshots(whole, [a, b]);

  it("sums each counter by its labels, in the order they were first seen", () => {
    expect(merged.requests).toEqual([
      { route: "/v1/chat/completions", status: 400, count: 3 },
      { route: "/v1/chat/completions", status: 200, count: 7 },
    ]);
    expect(merged.decisions).toEqual([
      { role: "decode", rule: "affinity", count: 4 },
      { role: "prefill", rule: "sticky", count: 2 },
    ]);
    expect(merged.disagg).toEqual([
      { mode: "disaggregated", reason: "always", count: 3 },
      { mode: "local", reason: "cached", count: 1 },
    ]);
    expect(merged.admission.rejected).toEqual([{ reason: "timeout", count: 3 }]);
  });

  it("adds the pools' prefix index figures, leases, queues and histograms; keeps the latest clock", () => {
    expect(merged.prefix).toEqual({ prefillEntries: 15, decodeEntries: 10, maxEntries: 200, lookedUpBlocks: 12, matchedBlocks: 6 });
    expect(merged.leases).toBe(3);
    expect(merged.admission.queued).toBe(1);
    expect(merged.latency.ttfb).toEqual({ bounds: [0.1, 1], counts: [1, 3], sum: 2, count: 4 });
    expect(merged.now).toBe(7);
  });

  it("lists every pool's signal pollers, each named with its pool (the status page shows them)", () => {
    expect(merged.pollers).toEqual([
      { poller: 0, nodes: 140, silentMs: 100, pool: "pool:m1" },
      { poller: 1, nodes: 120, silentMs: 9_000, pool: "pool:m1" },
      { poller: 0, nodes: 130, silentMs: 400, pool: "pool:m2" },
    ]);
  });

  it("lists every (mode, reason) at 0 before any was counted, and a counted one in its place", () => {
    const text = clusterMetrics({ snapshot: merged, keys: [], config: { valid: true, stale: false, problems: 0, served: true } }).find(
      (f) => f.name === "pd_router_disagg_decisions_total",
    );
    const samples = text?.samples as Array<{ labels: Record<string, string>; value: number }>;
    expect(samples[0]).toEqual({ labels: { mode: "disaggregated", reason: "always" }, value: 3 });
    expect(samples).toContainEqual({ labels: { mode: "local", reason: "cached" }, value: 1 });
    expect(samples).toContainEqual({ labels: { mode: "colocated", reason: "always" }, value: 0 });
    expect(samples.filter((s) => s.labels.mode === "local" && s.labels.reason === "cached")).toHaveLength(1);
  });
});
