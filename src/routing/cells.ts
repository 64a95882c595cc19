// Cells (docs/scaling.md, "One object per cell within a pool"): a pool's nodes cut into disjoint
// cells, each coordinated by an object of its own, and the order in which a request tries them.
// Pure: the same document gives every isolate the same cells, and a key the same order.

import { compareIds, rendezvousScore } from "./rendezvous";
import type { Role } from "./types";

/** What the cut reads of a node. */
export interface CellNode {
  id: string;
  role: Role | "both";
  group?: string | undefined;
  weight: number;
  models?: string[] | undefined;
}

const ROLES: readonly Role[] = ["prefill", "decode"];
const serves = (n: CellNode, role: Role) => n.role === role || n.role === "both";

/** a before b, compared element by element */
function lexLess(a: readonly number[], b: readonly number[]): boolean {
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return a[i]! < b[i]!;
  return false;
}

/**
 * Cuts `nodes` into `count` disjoint cells, deterministic by node id. A `group` (P/D group
 * affinity) stays whole in one cell. Units (a group, or a node without one) are dealt in id
 * order, those that bring one role (a P, a D) before those that bring both (a `both` node, a
 * group of P and D), each to the cell that: lacks a role it brings; then lacks the fewest roles
 * once it is there (a cell is completed before another is started); then holds the fewest units
 * of its kind (role and model list: each kind spreads evenly); then is the smallest; then comes
 * first. Ungrouped, that gives every cell a P and a D whenever there are `count` of each role's
 * nodes (a `both` counts for each). Each cell keeps its nodes in the order given; whether every
 * cell got what it needs is `cellLacks`'s to say.
 */
export function partitionCells<N extends CellNode>(nodes: readonly N[], count: number): N[][] {
  if (count <= 1) return [[...nodes]];
  const units = new Map<string, N[]>();
  for (const n of nodes) {
    const key = n.group !== undefined ? `group:${n.group}` : `node:${n.id}`;
    units.set(key, [...(units.get(key) ?? []), n]);
  }
  const kindOf = (n: CellNode) => `${n.role}|${(n.models ?? []).slice().sort().join(",")}`;
  const rolesOf = (list: readonly CellNode[]) => ROLES.filter((r) => list.some((n) => serves(n, r)));
  const cells = Array.from({ length: count }, () => ({ ids: new Set<string>(), kinds: new Map<string, number>(), roles: new Set<Role>() }));
  const order = [...units.entries()].map(([key, unit]) => ({ key, unit, brings: rolesOf(unit) })).sort((a, b) => a.brings.length - b.brings.length || compareIds(a.key, b.key));
  for (const { unit, brings } of order) {
    const kinds = [...new Set(unit.map(kindOf))];
    const score = (i: number): number[] => {
      const cell = cells[i]!;
      return [
        brings.some((r) => !cell.roles.has(r)) ? 0 : 1,
        ROLES.filter((r) => !cell.roles.has(r) && !brings.includes(r)).length,
        kinds.reduce((s, k) => s + (cell.kinds.get(k) ?? 0), 0),
        cell.ids.size,
        i,
      ];
    };
    let best = 0;
    for (let i = 1; i < count; i++) if (lexLess(score(i), score(best))) best = i;
    const cell = cells[best]!;
    for (const n of unit) cell.ids.add(n.id);
    for (const k of kinds) cell.kinds.set(k, (cell.kinds.get(k) ?? 0) + 1);
    for (const r of brings) cell.roles.add(r);
  }
  return cells.map((c) => nodes.filter((n) => c.ids.has(n.id)));
}

/**
 * What a cell lacks to serve every model it must (null: every model) in `roles`: e.g.
 * `decode-capable node for model "m"`; empty when it lacks nothing.
 */
export function cellLacks(cell: readonly CellNode[], roles: readonly Role[], models: ReadonlySet<string> | null): string[] {
  const lacks: string[] = [];
  for (const model of models === null ? [null] : [...models].sort(compareIds)) {
    for (const role of roles) {
      const ok = cell.some((n) => serves(n, role) && (model === null || !n.models || n.models.includes(model)));
      if (!ok) lacks.push(`${role}-capable node${model === null ? "" : ` for model "${model}"`}`);
    }
  }
  return lacks;
}

/** A cell as the Worker ranks it: its object's name, and its weight (its decode-capable nodes' weights). */
export interface RankedCell {
  id: string;
  weight: number;
}

/** The weight a cell is ranked with: what it can decode (the sum of its decode-capable nodes' weights). */
export const cellWeight = (cell: readonly CellNode[]): number => cell.reduce((s, n) => s + (serves(n, "decode") ? n.weight : 0), 0);

/**
 * The order in which a request tries the cells. With an affinity key: weighted rendezvous over
 * the cells' ids (a conversation always meets the same first cell, and adding a cell moves only
 * the keys it wins, about 1/N). Without one: a turn `start` (the isolate's round-robin count),
 * then the others in index order.
 */
export function cellOrder<C extends RankedCell>(cells: readonly C[], key: string | null, start = 0): C[] {
  if (cells.length <= 1) return [...cells];
  if (key === null) {
    const first = ((start % cells.length) + cells.length) % cells.length;
    return [...cells.slice(first), ...cells.slice(0, first)];
  }
  return cells
    .map((cell) => ({ cell, score: rendezvousScore(key, cell) }))
    .sort((a, b) => b.score - a.score || compareIds(a.cell.id, b.cell.id))
    .map((r) => r.cell);
}
