import { describe, expect, it } from "vitest";
import { NodeHealthTable } from "../../../src/state/health-table";
import { HEALTH } from "./fixtures";

// Each node's health record as the object applies what it hears: legs that ended, probes, picks.

const table = (...ids: string[]) => {
  const t = new NodeHealthTable();
  t.sync(new Set(ids));
  return t;
};
const fail = (t: NodeHealthTable, node: string, now: number, times = 1) => {
  for (let i = 0; i < times; i++) t.report({ node, outcome: "failure" }, now, HEALTH);
};

describe("the health table", () => {
  it("a failover target must be listed and healthy", () => {
    const t = table("d0", "d1");
    fail(t, "d1", 0, HEALTH.ejectAfter);
    expect(t.mayTake("d0", 10)).toBe(true);
    expect(t.mayTake("d1", 10)).toBe(false);
    expect(t.mayTake("unknown", 10)).toBe(false);
  });

  it("an ejected node past its ejection lets one trial through; its success closes the breaker", () => {
    const t = table("d0");
    fail(t, "d0", 0, HEALTH.ejectAfter);
    const after = HEALTH.ejectBaseMs + 1;
    expect(t.mayTake("d0", after)).toBe(true);
    t.picked("d0", after);
    expect(t.mayTake("d0", after)).toBe(false);
    t.report({ node: "d0", outcome: "ok" }, after, HEALTH);
    expect(t.view("d0")).toMatchObject({ failureStreak: 0, ejectedUntil: 0, trialInFlight: false });
  });

  it("a busy node (503/429) or an aborted leg tells nothing: the trial is freed, nothing counted", () => {
    const t = table("d0");
    fail(t, "d0", 0, HEALTH.ejectAfter);
    t.picked("d0", HEALTH.ejectBaseMs + 1);
    for (const outcome of ["busy", "aborted"] as const) t.report({ node: "d0", outcome }, HEALTH.ejectBaseMs + 2, HEALTH);
    expect(t.view("d0")).toMatchObject({ trialInFlight: false, failuresTotal: HEALTH.ejectAfter });
  });

  it("reports about unknown nodes, or without health settings, change nothing", () => {
    const t = table("d0");
    t.report({ node: "d0", outcome: "failure" }, 0, undefined);
    t.report({ node: "x", outcome: "failure" }, 0, HEALTH);
    t.picked("x", 0);
    expect(t.view("d0").failuresTotal).toBe(0);
    expect(t.get("x")).toBeUndefined();
  });

  it("a probe says when the node came back up after its probes failed (its cache is likely gone)", () => {
    const t = table("d0");
    const seen = [false, true, false, true, true, true].map((ok, i) => t.probed("d0", ok, i, { ...HEALTH, downAfter: 1, upAfter: 2 }));
    expect(seen).toEqual([false, false, false, false, true, false]);
    expect(t.probed("unknown", true, 0, HEALTH)).toBe(false);
  });
});
