import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { promptTokensOf, uncachedTokensOf, workWeightedLoads } from "../../../src/routing/work";
import { withoutFileEngines } from "../helpers";

withoutFileEngines();

// A request's size in tokens for one node, and in-flight load counted by work (issue 17 item 4).

describe("a prompt's tokens on a node", () => {
  it("divides its characters by the node's characters per token (4 by default), at least 1", () => {
    expect(promptTokensOf(4096)).toBe(1024);
    expect(promptTokensOf(4096, 2)).toBe(2048);
    expect(promptTokensOf(3)).toBe(1);
    expect(promptTokensOf(0)).toBe(0);
  });

  it("uncached: what lies past the blocks the node holds, never below 0 or above the prompt", () => {
    // 10 blocks of 2048 chars, 4 held: 6 * 2048 / 4 tokens
    expect(uncachedTokensOf(10 * 2048, 4, 2048)).toBe(3072);
    // a partial tail block is never cached
    expect(uncachedTokensOf(10 * 2048 + 100, 10, 2048)).toBe(25);
    fc.assert(
      fc.property(fc.nat(200_000), fc.nat(300), fc.integer({ min: 64, max: 4096 }), fc.double({ min: 1, max: 8, noNaN: true }), (chars, matched, block, cpt) => {
        const u = uncachedTokensOf(chars, matched, block, cpt);
        expect(u).toBeGreaterThanOrEqual(0);
        expect(u).toBeLessThanOrEqual(promptTokensOf(chars, cpt));
      }),
    );
  });
});

describe("workWeightedLoads", () => {
  it("counts a node holding long prompts as more loaded than one holding short ones", () => {
    // two requests each: 20k tokens vs 2k tokens
    const [a, b] = workWeightedLoads(
      [
        { load: 2, work: 20_000 },
        { load: 2, work: 2_000 },
      ],
      [true, true],
    );
    expect(a).toBeGreaterThan(3);
    expect(b).toBeLessThan(1);
  });

  it("over the members, sums to their request count (so bounded load's bounds keep their meaning; property)", () => {
    fc.assert(
      fc.property(fc.array(fc.record({ load: fc.nat(20), perRequest: fc.integer({ min: 1, max: 50_000 }), member: fc.boolean() }), { minLength: 1, maxLength: 8 }), (rows) => {
        const nodes = rows.map((r) => ({ load: r.load, work: r.load * r.perRequest }));
        const members = rows.map((r) => r.member);
        const loads = workWeightedLoads(nodes, members);
        const count = rows.reduce((n, r) => n + (r.member ? r.load : 0), 0);
        const sum = loads.reduce((n, l, i) => n + (members[i] ? l : 0), 0);
        expect(sum).toBeCloseTo(count, 6);
        for (const l of loads) expect(l).toBeGreaterThanOrEqual(0);
      }),
    );
  });

  it("is the plain count without work figures or with nothing in flight", () => {
    expect(workWeightedLoads([{ load: 3 }, { load: 1 }], [true, true])).toEqual([3, 1]);
    expect(
      workWeightedLoads(
        [
          { load: 0, work: 0 },
          { load: 0, work: 0 },
        ],
        [true, true],
      ),
    ).toEqual([0, 0]);
  });
});
