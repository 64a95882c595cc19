import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { type CellNode, cellLacks, cellOrder, partitionCells } from "../../../src/routing/cells";
import { withoutFileEngines } from "../helpers";
import { testKeys } from "./fixtures";

withoutFileEngines();

// Cells (docs/scaling.md): a pool's nodes cut into disjoint cells, and the order a request tries them.

const SEED = { seed: 24, numRuns: 200 };
const ROLES = ["prefill", "decode", "both"] as const;

/** Ungrouped nodes with unique ids and random roles. */
const nodeLists = fc
  .uniqueArray(fc.stringMatching(/^[a-z0-9]{1,5}$/), { minLength: 1, maxLength: 24 })
  .chain((ids) => fc.tuple(fc.constant(ids), fc.array(fc.constantFrom(...ROLES), { minLength: ids.length, maxLength: ids.length })))
  .map(([ids, roles]): CellNode[] => ids.map((id, i) => ({ id, role: roles[i]!, weight: 1 })));

const ids = (cells: CellNode[][]) => cells.map((c) => c.map((n) => n.id).sort());
const capable = (nodes: CellNode[], role: "prefill" | "decode") => nodes.filter((n) => n.role === role || n.role === "both").length;

describe("partitionCells", () => {
  it("cuts the nodes into disjoint cells that cover them all, the same whatever the order they are listed in", () => {
    fc.assert(
      fc.property(nodeLists, fc.integer({ min: 1, max: 6 }), (nodes, count) => {
        const cells = partitionCells(nodes, count);
        expect(cells).toHaveLength(count);
        expect(
          cells
            .flat()
            .map((n) => n.id)
            .sort(),
        ).toEqual(nodes.map((n) => n.id).sort());
        expect(ids(partitionCells([...nodes].reverse(), count))).toEqual(ids(cells));
      }),
      SEED,
    );
  });

  it("gives every cell a prefill-capable and a decode-capable node whenever there are as many of each as cells", () => {
    fc.assert(
      fc.property(nodeLists, fc.integer({ min: 2, max: 6 }), (nodes, count) => {
        fc.pre(capable(nodes, "prefill") >= count && capable(nodes, "decode") >= count);
        for (const cell of partitionCells(nodes, count)) expect(cellLacks(cell, ["prefill", "decode"], null)).toEqual([]);
      }),
      SEED,
    );
  });

  it("keeps a P/D group whole in one cell, and spreads the rest evenly", () => {
    const nodes: CellNode[] = [
      { id: "p0", role: "prefill", group: "rack-a", weight: 1 },
      { id: "d0", role: "decode", group: "rack-a", weight: 1 },
      { id: "p1", role: "prefill", group: "rack-b", weight: 1 },
      { id: "d1", role: "decode", group: "rack-b", weight: 1 },
      { id: "p2", role: "prefill", weight: 1 },
      { id: "d2", role: "decode", weight: 1 },
      { id: "p3", role: "prefill", weight: 1 },
      { id: "d3", role: "decode", weight: 1 },
    ];
    const cells = ids(partitionCells(nodes, 2));
    for (const [p, d] of [
      ["p0", "d0"],
      ["p1", "d1"],
    ])
      expect(cells.find((c) => c.includes(p!))).toContain(d);
    expect(cells.map((c) => c.length)).toEqual([4, 4]);
    for (const cell of partitionCells(nodes, 2)) expect(cellLacks(cell, ["prefill", "decode"], null)).toEqual([]);
  });

  it("names what a cell lacks, per model of its pool", () => {
    const cell: CellNode[] = [
      { id: "p0", role: "prefill", weight: 1, models: ["a"] },
      { id: "c0", role: "both", weight: 1, models: ["b"] },
    ];
    expect(cellLacks(cell, ["prefill", "decode"], new Set(["a", "b"]))).toEqual(['decode-capable node for model "a"']);
    expect(cellLacks(cell, ["decode"], null)).toEqual([]);
  });
});

describe("cellOrder", () => {
  const cells = (n: number) => Array.from({ length: n }, (_, i) => ({ id: `pool/cell:${i}`, weight: 1 }));
  const first = (key: string, n: number) => cellOrder(cells(n), key)[0]!.id;

  it("orders every cell, the same for a key every time: a conversation always meets one cell first", () => {
    for (const key of testKeys(50)) {
      const order = cellOrder(cells(4), key);
      expect(order.map((c) => c.id).sort()).toEqual(cells(4).map((c) => c.id));
      expect(cellOrder([...cells(4)].reverse(), key)).toEqual(order);
    }
  });

  it("spreads keys over the cells by weight, and a new cell takes about 1/N of them, only to itself", () => {
    const keys = testKeys(4000);
    for (const n of [2, 3, 4]) {
      const counts = new Map<string, number>();
      for (const key of keys) counts.set(first(key, n), (counts.get(first(key, n)) ?? 0) + 1);
      for (const count of counts.values()) expect(Math.abs(count / keys.length - 1 / n)).toBeLessThan(0.03);
      const moved = keys.filter((key) => first(key, n) !== first(key, n + 1));
      // every key that moved went to the new cell, and about 1/(n+1) of them did
      for (const key of moved) expect(first(key, n + 1)).toBe(`pool/cell:${n}`);
      expect(Math.abs(moved.length / keys.length - 1 / (n + 1))).toBeLessThan(0.03);
    }
    const heavy = [
      { id: "a", weight: 3 },
      { id: "b", weight: 1 },
    ];
    const onA = keys.filter((key) => cellOrder(heavy, key)[0]!.id === "a").length / keys.length;
    expect(Math.abs(onA - 0.75)).toBeLessThan(0.03);
  });

  it("without a key: round robin from the turn given", () => {
    expect(cellOrder(cells(3), null, 0).map((c) => c.id)).toEqual(["pool/cell:0", "pool/cell:1", "pool/cell:2"]);
    expect(cellOrder(cells(3), null, 4).map((c) => c.id)).toEqual(["pool/cell:1", "pool/cell:2", "pool/cell:0"]);
  });
});
