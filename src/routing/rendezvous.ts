import { rendezvousUnit } from "./hash";
import type { CandidateNode } from "./types";

export interface RankedNode {
  node: CandidateNode;
  score: number;
}

/**
 * Weighted rendezvous (highest random weight) score of one node for `key`:
 * -weight / ln(u), u uniform in (0,1). The node with the highest score wins, and a node wins with
 * probability weight / total weight; removing a node only moves the keys it was winning.
 * A non-positive or non-finite weight scores 0 (ranks last).
 */
export function rendezvousScore(key: string, node: Pick<CandidateNode, "id" | "weight">): number {
  if (!(node.weight > 0) || !Number.isFinite(node.weight)) return 0;
  return -node.weight / Math.log(rendezvousUnit(key, node.id));
}

/** Compares ids by UTF-16 code units (locale-independent, so identical everywhere). */
export function compareIds(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

/** All `nodes` ordered by rendezvous score for `key`, best first; equal scores by id. */
export function rendezvousRank(key: string, nodes: readonly CandidateNode[]): RankedNode[] {
  return nodes.map((node) => ({ node, score: rendezvousScore(key, node) })).sort((a, b) => b.score - a.score || compareIds(a.node.id, b.node.id));
}
