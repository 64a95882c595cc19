import { describe, expect, it } from "vitest";
import { isHealthy } from "../../../src/state/health";
import { BUSY_RETRY_DEFAULT_MS, BUSY_RETRY_MAX_MS, NodeHealthTable } from "../../../src/state/health-table";
import { HEALTH } from "./fixtures";
import { withoutFileEngines } from "../helpers";

withoutFileEngines();

// The busy window in the health table (issue 18 item 6): a leg that ended `busy` (503/429) leaves
// its node alone for the retry-after it named — 1 s without one, at most 300 s — and never counts
// against it: the breaker and ejection only hear failures.

const table = (...ids: string[]) => {
  const t = new NodeHealthTable();
  t.sync(new Set(ids));
  return t;
};

describe("the busy window", () => {
  it("lasts the retry-after the node named, from when it was heard", () => {
    const t = table("d0");
    t.report({ node: "d0", outcome: "busy", retryAfterMs: 2_000 }, 10_000, HEALTH);
    expect(t.view("d0").busyUntil).toBe(12_000);
    expect(t.busyEnd(10_000)).toBe(12_000);
    expect(t.busyEnd(11_999)).toBe(12_000);
    // over: nothing to wake for
    expect(t.busyEnd(12_000)).toBe(Infinity);
  });

  it("1 s when the node named no time; never longer than 300 s", () => {
    const t = table("a", "b", "c");
    t.report({ node: "a", outcome: "busy" }, 0, HEALTH);
    t.report({ node: "b", outcome: "busy", retryAfterMs: null }, 0, HEALTH);
    t.report({ node: "c", outcome: "busy", retryAfterMs: 10 * BUSY_RETRY_MAX_MS }, 0, HEALTH);
    expect([t.view("a").busyUntil, t.view("b").busyUntil, t.view("c").busyUntil]).toEqual([BUSY_RETRY_DEFAULT_MS, BUSY_RETRY_DEFAULT_MS, BUSY_RETRY_MAX_MS]);
  });

  it("the earliest open window is the one to wake for; the latest answer sets a node's window", () => {
    const t = table("a", "b");
    t.report({ node: "a", outcome: "busy", retryAfterMs: 5_000 }, 0, HEALTH);
    t.report({ node: "b", outcome: "busy", retryAfterMs: 2_000 }, 1_000, HEALTH);
    expect(t.busyEnd(1_000)).toBe(3_000);
    expect(t.busyEnd(3_000)).toBe(5_000);
    t.report({ node: "a", outcome: "busy", retryAfterMs: 1_000 }, 3_500, HEALTH);
    expect(t.busyEnd(3_500)).toBe(4_500);
  });

  it("never counts as a failure: many busy answers in a row leave the breaker closed and the node healthy", () => {
    const t = table("d0");
    for (let i = 0; i < 10 * HEALTH.ejectAfter; i++) t.report({ node: "d0", outcome: "busy", retryAfterMs: 1_000 }, i, HEALTH);
    const h = t.view("d0");
    expect([h.failureStreak, h.failuresTotal, h.ejectedUntil]).toEqual([0, 0, 0]);
    expect(isHealthy(h, 100)).toBe(true);
  });

  it("a failure or an abort later leaves it alone; a good answer ends it (the node serves again: issue 25 item 7)", () => {
    const t = table("d0");
    t.report({ node: "d0", outcome: "busy", retryAfterMs: 4_000 }, 0, HEALTH);
    for (const outcome of ["failure", "aborted"] as const) t.report({ node: "d0", outcome }, 1_000, HEALTH);
    expect(t.view("d0").busyUntil).toBe(4_000);
    for (const outcome of ["ok", "client_error"] as const) {
      t.report({ node: "d0", outcome: "busy", retryAfterMs: 4_000 }, 0, HEALTH);
      t.report({ node: "d0", outcome }, 1_000, HEALTH);
      expect(t.view("d0").busyUntil).toBe(0);
    }
  });

  it("is forgotten with the node when it leaves the document", () => {
    const t = table("d0", "d1");
    t.report({ node: "d0", outcome: "busy", retryAfterMs: 60_000 }, 0, HEALTH);
    t.sync(new Set(["d1"]));
    expect(t.busyEnd(0)).toBe(Infinity);
    t.sync(new Set(["d0", "d1"]));
    expect(t.view("d0").busyUntil).toBe(0);
  });
});
