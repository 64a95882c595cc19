// pdGroup (SPEC 5): prefer a partner in the other role's group, or keep both roles inside one. Pure.

import { fail, isAvailable, nodeById, type Pool, type Ranked, rankRole, weightOf } from "./rank-role";
import type { CandidateNode, Result, Role, RoleDecision, ScoredCandidate, SelectionError } from "./types";

/**
 * prefer: take the best-ranked node of the partner's group (g) over the best node overall (b) —
 * D in P's group, or under conditional disaggregation P in D's group — when its load per unit of
 * weight is within the bonus of b's: g.load / g.weight <= b.load / b.weight * (1 + bonus) (SPEC 5).
 * Load is the one the policy weighed (in-flight requests weighted by their tokens, plus the KV
 * barrier for D), so a D near a full cache is not preferred for its group; a busy one never is
 * (`preferred` holds only nodes that may take work). Dividing by weight compares nodes of
 * different sizes fairly, and an idle cluster (0 <= 0) always stays in the group whatever the
 * weights. A sticky or fail-open pick stays.
 */
export function preferGroup(ranked: Ranked, pool: Pool, group: string, bonus: number): RoleDecision {
  const decision = ranked.decision;
  if (decision.rule === "sticky" || decision.failOpen) return decision;
  const best = nodeById(pool.nodes, decision.id);
  if (!best || best.group === group) return decision;
  const sameGroup = inGroupOf(pool, group);
  const inGroupId = ranked.preferred.find(sameGroup);
  const inGroup = inGroupId === undefined ? undefined : nodeById(pool.nodes, inGroupId);
  if (!inGroup) return decision;
  const perWeight = (n: CandidateNode): number => (ranked.effective.get(n.id) ?? n.load) / weightOf(n);
  const within = perWeight(inGroup) <= perWeight(best) * (1 + bonus);
  if (!within) return decision;

  const order = [decision.id, ...decision.fallbacks].filter((id) => id !== inGroup.id);
  const pickedAt = decision.candidates.findIndex((c) => c.id === inGroup.id);
  return {
    id: inGroup.id,
    rule: "pdgroup_prefer",
    candidates: decision.candidates.map((c, i) => (i < pickedAt && c.skipped === undefined && c.group !== group ? { ...c, skipped: "group" } : c)),
    fallbacks: [...order.filter(sameGroup), ...order.filter((id) => !sameGroup(id))],
    failOpen: false,
  };
}

interface StrictOutcome {
  prefill: RoleDecision;
  decode: RoleDecision;
  decodeUsedRoundRobin: boolean;
}

/**
 * strict: walk P's ranking (its pick, then its fallbacks) to the first P whose group has a D that
 * may take the request, and pick that D by the decode policy within the group. Both roles'
 * fallbacks stay inside the group, so a failover never crosses groups either.
 */
export function strictGroup(prefill: Ranked, prefillPool: Pool, decodePool: Pool): Result<StrictOutcome, SelectionError> {
  const walk = [prefill.decision.id, ...prefill.decision.fallbacks];
  const tried: string[] = [];
  let busy: ScoredCandidate[] | null = null;
  for (const [index, pid] of walk.entries()) {
    const group = nodeById(prefillPool.nodes, pid)?.group;
    if (group === undefined || tried.includes(group)) continue;
    tried.push(group);
    const decode = rankRole(decodePool, group);
    if (decode.kind === "busy") busy ??= decode.candidates;
    if (decode.kind !== "ok") continue;

    const p = prefill.decision;
    const prefillDecision: RoleDecision = { ...walkedTo(p, walk.slice(0, index), pid, prefillPool), rule: index === 0 ? p.rule : "pdgroup_strict", failOpen: p.failOpen };
    const d = decode.decision;
    const decodeDecision: RoleDecision = d.rule === "sticky" || d.rule === "fail_open" ? d : { ...d, rule: "pdgroup_strict" };
    return {
      ok: true,
      value: { prefill: prefillDecision, decode: decodeDecision, decodeUsedRoundRobin: decode.usedRoundRobin },
    };
  }

  // a group had decode nodes that may take work, all busy: the request waits rather than fails
  if (busy) return fail({ kind: "decode_busy", candidates: busy });
  return noneInGroup("decode", "prefill", tried, decodePool.nodes);
}

function withoutSkip(c: ScoredCandidate): ScoredCandidate {
  if (c.skipped === undefined) return c;
  const { skipped: _skipped, ...rest } = c;
  return rest;
}

/** Whether a node of the pool is in `group`. */
export function inGroupOf(pool: Pool, group: string | undefined): (id: string) => boolean {
  return (id) => nodeById(pool.nodes, id)?.group === group;
}

/** pdGroup strict found no group with both roles: the groups tried for `other`, and those where `role` may take work. */
export function noneInGroup(role: Role, other: Role, tried: string[], pool: CandidateNode[]): Result<never, SelectionError> {
  const list = (groups: string[]) => groups.join(", ") || "none";
  const available = [...new Set(pool.filter(isAvailable).map((n) => n.group))];
  return fail({
    kind: "no_decode_in_group",
    message: `pdGroup strict: no ${role} node may take work in a group of the ${other} candidates (tried: ${list(tried)}; with an available ${role} node: ${list(available)})`,
  });
}

/**
 * pdGroup strict's pick `id` further down `first`'s ranking, past the nodes `passed`: those are
 * skipped for their group, and failover stays in the pick's group.
 */
export function walkedTo(first: RoleDecision, passed: string[], id: string, pool: Pool): Pick<RoleDecision, "id" | "candidates" | "fallbacks"> {
  const skipped = new Set(passed);
  const inGroup = inGroupOf(pool, nodeById(pool.nodes, id)?.group);
  return {
    id,
    candidates: first.candidates.map((c) => (skipped.has(c.id) ? { ...c, skipped: "group" } : c.id === id ? withoutSkip(c) : c)),
    fallbacks: [first.id, ...first.fallbacks].filter((f) => f !== id && inGroup(f)),
  };
}
