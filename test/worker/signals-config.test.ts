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
    expect(r.config.signals).toEqual({ intervalMs: 5000, staleMs: 15000, kvBusy: 0.9, queueBusy: 8 });
    expect(r.config.admission).toEqual({ queueMs: 30000, maxQueued: 1000 });
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

  it("accept no waiting and no queue", () => {
    expect(problems({ admission: { queueMs: 0, maxQueued: 0 } })).toEqual([]);
  });
});
