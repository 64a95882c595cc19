import { describe, expect, it } from "vitest";
import type { HealthSettings } from "../../../src/config/cluster-view";
import { breakerState, ejectionMs, freshHealth, onFailure, onPicked, onSuccess } from "../../../src/state/health";
import { withoutFileEngines } from "../helpers";
import { HEALTH } from "./fixtures";

withoutFileEngines();

// The breaker's ejection doubles with each ejection in a row and never passes ejectMaxMs
// (src/state/health.ts): a node that keeps failing its half-open trial is tried again at least
// every ejectMaxMs, not after hours.

describe("the breaker's backoff", () => {
  it("doubles from ejectBaseMs with each failed trial, up to ejectMaxMs and no further", () => {
    const s: HealthSettings = { ...HEALTH, ejectAfter: 1, ejectBaseMs: 1_000, ejectMaxMs: 5_000 };
    const h = freshHealth();
    let now = 0;
    const lengths: number[] = [];
    for (let i = 0; i < 6; i++) {
      onFailure(h, now, s);
      lengths.push(h.ejectedUntil - now);
      // the ejection runs out: the next request is the half-open trial, and it fails too
      now = h.ejectedUntil;
      expect(breakerState(h, now)).toBe("half_open");
      onPicked(h, now);
    }
    expect(lengths).toEqual([1_000, 2_000, 4_000, 5_000, 5_000, 5_000]);
    // a good answer closes the breaker and starts the doubling over
    onSuccess(h);
    onFailure(h, now, s);
    expect(h.ejectedUntil - now).toBe(1_000);
  });

  it("a cap below what the doubling reaches holds for ejections in any number", () => {
    const s: HealthSettings = { ...HEALTH, ejectBaseMs: 1_000, ejectMaxMs: 8_000 };
    expect([1, 2, 4, 5, 30, 2_000].map((n) => ejectionMs(n, s))).toEqual([1_000, 2_000, 8_000, 8_000, 8_000, 8_000]);
  });
});
