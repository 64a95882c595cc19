import { describe, expect, it } from "vitest";
import fc from "fast-check";
import { rendezvousRank } from "../../../src/routing/rendezvous";
import type { CandidateNode } from "../../../src/routing/types";
import { node, testKeys } from "./fixtures";
import { withoutFileEngines } from "../helpers";

withoutFileEngines();

const winner = (key: string, nodes: CandidateNode[]): string => rendezvousRank(key, nodes)[0]!.node.id;

const nodeSets = fc
  .uniqueArray(fc.stringMatching(/^[a-z0-9]{1,6}$/), { minLength: 2, maxLength: 8 })
  .chain((ids) => fc.tuple(fc.constant(ids), fc.array(fc.constantFrom(0.5, 1, 2, 3), { minLength: ids.length, maxLength: ids.length })))
  .map(([ids, weights]) => ids.map((id, i) => node(id, { weight: weights[i] ?? 1 })));

describe("rendezvousRank", () => {
  it("ranks every node, scores descending, deterministically", () => {
    fc.assert(
      fc.property(fc.string(), nodeSets, (key, nodes) => {
        const ranked = rendezvousRank(key, nodes);
        expect(ranked.map((r) => r.node.id).sort()).toEqual(nodes.map((n) => n.id).sort());
        for (let i = 1; i < ranked.length; i++) expect(ranked[i - 1]!.score).toBeGreaterThanOrEqual(ranked[i]!.score);
        expect(rendezvousRank(key, [...nodes].reverse())).toEqual(ranked);
      }),
    );
  });

  it("removing a node moves exactly the keys that were on it", () => {
    fc.assert(
      fc.property(nodeSets, fc.nat(), fc.array(fc.string(), { minLength: 20, maxLength: 60 }), (nodes, pick, keys) => {
        const removed = nodes[pick % nodes.length]!;
        const rest = nodes.filter((n) => n !== removed);
        for (const key of keys) {
          const before = winner(key, nodes);
          const after = winner(key, rest);
          if (before !== removed.id) expect(after).toBe(before);
        }
      }),
    );
  });

  it("adding a node moves keys only to it", () => {
    fc.assert(
      fc.property(nodeSets, fc.array(fc.string(), { minLength: 20, maxLength: 60 }), (nodes, keys) => {
        const added = node("new-node", { weight: 2 });
        for (const key of keys) {
          const before = winner(key, nodes);
          const after = winner(key, [...nodes, added]);
          expect([before, added.id]).toContain(after);
        }
      }),
    );
  });

  it("gives each node a share of keys proportional to its weight (20k keys, ±15%)", () => {
    const nodes = [node("a", { weight: 1 }), node("b", { weight: 2 }), node("c", { weight: 3 }), node("d", { weight: 2 })];
    const total = nodes.reduce((s, n) => s + n.weight, 0);
    const keys = testKeys(20_000);
    const counts = new Map<string, number>();
    for (const key of keys) counts.set(winner(key, nodes), (counts.get(winner(key, nodes)) ?? 0) + 1);
    for (const n of nodes) {
      const expected = (keys.length * n.weight) / total;
      expect(Math.abs((counts.get(n.id) ?? 0) - expected) / expected).toBeLessThan(0.15);
    }
  });

  it("breaks equal scores by id", () => {
    const ranked = rendezvousRank("k", [node("b", { weight: 0 }), node("a", { weight: 0 })]);
    expect(ranked.map((r) => r.node.id)).toEqual(["a", "b"]);
  });
});
