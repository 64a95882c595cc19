import { describe, expect, it } from "vitest";
import { parseClusterDocument } from "../../src/config/schema";
import { withoutFileEngines } from "./helpers";

withoutFileEngines();

// The document's `signals` and `admission` blocks (SPEC 8): defaults, bounds, and a bad field named.

const nodes = [
  { id: "p0", url: "http://10.0.0.1:8100", role: "prefill" },
  { id: "d0", url: "http://10.0.0.2:8200", role: "decode" },
];
const problems = (doc: Record<string, unknown>) => {
  const r = parseClusterDocument({ nodes, ...doc });
  return r.ok ? [] : r.problems.map((p) => p.path);
};

describe("signals and admission in the cluster document", () => {
  it("default to SPEC 8's values", () => {
    const r = parseClusterDocument({ nodes });
    if (!r.ok) throw new Error(JSON.stringify(r.problems));
    expect(r.config.signals).toEqual({ intervalMs: 5000, staleMs: 15000, kvBusy: 0.9, queueBusy: 8, shardAbove: 256, nodesPerPoller: 128 });
    expect(r.config.admission).toEqual({ queueMs: 30000, maxQueued: 1000, ttftSloMs: null, fairShare: "apiKey", priorityReserve: 0 });
  });

  it("name the bad field", () => {
    expect(problems({ signals: { intervalMs: 50 } })).toEqual(["signals.intervalMs"]);
    expect(problems({ signals: { kvBusy: 0 } })).toEqual(["signals.kvBusy"]);
    expect(problems({ signals: { kvBusy: 1.2 } })).toEqual(["signals.kvBusy"]);
    expect(problems({ signals: { queueBusy: 0 } })).toEqual(["signals.queueBusy"]);
    expect(problems({ signals: { intervalMs: 5000, staleMs: 5000 } })).toEqual(["signals.staleMs"]);
    expect(problems({ signals: { kvbusy: 0.5 } })).toEqual(["signals"]);
    expect(problems({ admission: { queueMs: -1 } })).toEqual(["admission.queueMs"]);
    expect(problems({ admission: { maxQueued: 1.5 } })).toEqual(["admission.maxQueued"]);
  });

  it("SPEC 9's admission fields and the node's priorityScheduling: bounds, and a bad field named", () => {
    expect(problems({ admission: { ttftSloMs: 2000, fairShare: "none" } })).toEqual([]);
    expect(problems({ admission: { ttftSloMs: null } })).toEqual([]);
    expect(problems({ admission: { ttftSloMs: 0 } })).toEqual(["admission.ttftSloMs"]);
    expect(problems({ admission: { ttftSloMs: 1.5 } })).toEqual(["admission.ttftSloMs"]);
    expect(problems({ admission: { fairShare: "user" } })).toEqual(["admission.fairShare"]);
    expect(problems({ admission: { priorityReserve: 0.1 } })).toEqual([]);
    expect(problems({ admission: { priorityReserve: 0.6 } })).toEqual(["admission.priorityReserve"]);
    expect(problems({ admission: { priorityReserve: -0.1 } })).toEqual(["admission.priorityReserve"]);
    const flagged = [nodes[0], { ...nodes[1], priorityScheduling: true }];
    expect(parseClusterDocument({ nodes: flagged }).ok).toBe(true);
    const r = parseClusterDocument({ protocol: "sglang", nodes: flagged });
    expect(r.ok ? [] : r.problems.map((p) => p.path)).toEqual(["nodes[1].priorityScheduling"]);
    expect(problems({ nodes: [nodes[0], { ...nodes[1], priorityScheduling: "yes" }] })).toEqual(["nodes[1].priorityScheduling"]);
  });

  it("accept no waiting and no queue", () => {
    expect(problems({ admission: { queueMs: 0, maxQueued: 0 } })).toEqual([]);
  });
});
