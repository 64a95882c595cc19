import { cellLacks, cellOrder, cellWeight, partitionCells } from "../routing/cells";
import type { Role } from "../routing/types";
import { nodePools, type NodePool } from "./pools";
import { DISAGGREGATED_PROTOCOLS, type ClusterConfig, type Problem } from "./schema";

// The document's `cells` (docs/scaling.md, "One object per cell within a pool"): each pool cut
// into that many cells of disjoint nodes, each a ClusterState object of its own
// (`<pool key>/cell:<i>`) owning its nodes' leases, health, prefix memory and signals. One cell
// (the default) is the pool itself, under the name it always had.

const cut = new WeakMap<ClusterConfig, Map<string, NodePool[]>>();

/** A pool's cells, computed once per document and pool; the pool itself when `cells` is 1. */
export function cellsOf(config: ClusterConfig, pool: NodePool): NodePool[] {
  const count = config.cells ?? 1;
  if (count <= 1) return [pool];
  let byPool = cut.get(config);
  if (!byPool) {
    byPool = new Map();
    cut.set(config, byPool);
  }
  let cells = byPool.get(pool.key);
  if (!cells) {
    cells = partitionCells(pool.nodes, count).map((nodes, i) => ({ key: `${pool.key}/cell:${i}`, nodes, models: pool.models }));
    byPool.set(pool.key, cells);
  }
  return cells;
}

/** Every object that routes: each pool's cells (the pools themselves without cells). */
export function routingUnits(config: ClusterConfig): NodePool[] {
  return nodePools(config).flatMap((pool) => cellsOf(config, pool));
}

/** The roles every cell of the document's protocol needs: P and D when disaggregated, a D otherwise. */
const rolesNeeded = (config: ClusterConfig): Role[] => (DISAGGREGATED_PROTOCOLS.includes(config.protocol) ? ["prefill", "decode"] : ["decode"]);

/**
 * A `cells` count some pool cannot give: a cell without a node of a role it needs (for a model of
 * its pool) would refuse or strand that pool's requests, so the document is refused, naming the
 * pool, the cell and what it lacks (not capped: a count that silently means less would hide it).
 */
export function cellProblems(config: ClusterConfig): Problem[] {
  if ((config.cells ?? 1) <= 1) return [];
  const problems: Problem[] = [];
  for (const pool of nodePools(config)) {
    for (const cell of cellsOf(config, pool)) {
      const lacks = cellLacks(cell.nodes, rolesNeeded(config), pool.models);
      if (lacks.length === 0) continue;
      problems.push({
        path: "cells",
        message:
          `${config.cells} cells: cell ${cell.key} of pool ${pool.key} (${pool.nodes.length} nodes) would have no ${lacks.join(" and no ")} ` +
          "(each cell needs the roles its pool's requests use; a group stays whole in one cell): lower cells, or add nodes",
      });
      break;
    }
  }
  return problems;
}

let turn = 0;

/**
 * The cells a request tries, in order: rendezvous of its affinity key over the cells of the
 * model's pool; a request without a key starts at the next cell in this isolate's round robin.
 */
export function cellsFor(config: ClusterConfig, pool: NodePool, key: string | null): NodePool[] {
  const cells = cellsOf(config, pool);
  if (cells.length <= 1) return cells;
  const ranked = cells.map((cell) => ({ id: cell.key, weight: cellWeight(cell.nodes), cell }));
  return cellOrder(ranked, key, key === null ? turn++ : 0).map((r) => r.cell);
}
