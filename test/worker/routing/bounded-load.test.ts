import { describe, expect, it } from "vitest";
import fc from "fast-check";
import { loadBound } from "../../../src/routing/bounded-load";
import { withoutFileEngines } from "../helpers";

withoutFileEngines();

describe("loadBound", () => {
  it("is ceil(loadFactor * (T + 1) * w / W)", () => {
    expect(loadBound(1, 2, 0, 1.25)).toBe(1); // ceil(0.625)
    expect(loadBound(1, 2, 3, 1.25)).toBe(3); // ceil(2.5)
    expect(loadBound(2, 4, 9, 1.2)).toBe(6); // exactly 6: float noise must not make it 7
    expect(loadBound(1, 3, 5, 1)).toBe(2);
  });

  it("leaves room on some node of the pool whenever loadFactor >= 1", () => {
    fc.assert(
      fc.property(
        fc.array(fc.tuple(fc.constantFrom(0.5, 1, 2, 3), fc.nat(50)), { minLength: 1, maxLength: 10 }),
        fc.double({ min: 1, max: 3, noNaN: true }),
        (nodes, loadFactor) => {
          const W = nodes.reduce((s, [w]) => s + w, 0);
          const T = nodes.reduce((s, [, load]) => s + load, 0);
          expect(nodes.some(([w, load]) => load < loadBound(w, W, T, loadFactor))).toBe(true);
        },
      ),
    );
  });

  it("adds loadSlack to every node's bound (0 is the strict rule)", () => {
    expect(loadBound(1, 2, 0, 1.25, 4)).toBe(5); // ceil(0.625) + 4
    expect(loadBound(2, 4, 9, 1.2, 4)).toBe(10);
    expect(loadBound(1, 3, 5, 1, 0)).toBe(loadBound(1, 3, 5, 1));
  });

  it("with the default slack, an idle 3-node pool lets each node keep a few conversations", () => {
    // T = 1 in flight on the top node of a key: ceil(1.25 * 2 / 3) + 4 = 5 > 1, so it takes the next turn.
    expect(1).toBeLessThan(loadBound(1, 3, 1, 1.25, 4));
    // the strict rule would move it (1 is not below ceil(0.83) = 1)
    expect(1).not.toBeLessThan(loadBound(1, 3, 1, 1.25, 0));
  });

  it("has no bound without weight", () => {
    expect(loadBound(1, 0, 5, 1.25)).toBe(Number.POSITIVE_INFINITY);
  });
});
