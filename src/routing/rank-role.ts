// One role's ranking (SPEC 5): a pool's nodes in its policy's order under the bounds, the decode
// KV guard and stickiness, and the node it picks. Pure; select.ts and its modes combine two of them.

import { loadBound } from "./bounded-load";
import { isBusyFor, kvBarrier } from "./kv-guard";
import { compareIds, rendezvousScore } from "./rendezvous";
import type { CandidateNode, DecisionRule, GuardSettings, PolicyName, Result, Role, RoleDecision, ScoredCandidate, SelectionError, SelectionInput } from "./types";
import { promptTokensOf, uncachedTokensOf, workWeightedLoads } from "./work";

/**
 * cache_aware's recent share: each request counts its tokens plus this fraction of the pool's mean
 * tokens a request (its decoding and KV, which a prefill-token count misses). Measured on the
 * Mooncake trace (8 nodes; max/mean in prefill tokens, in requests): 0 gives 1.01 and 1.69 (one
 * node holding a much-reused prefix takes its cheap turns without end), 1 gives 1.08-1.12 and
 * 1.38-1.41 (over the 1.10 target), 0.5 gives about 1.06 and 1.46, at the best hit ratio of the three.
 */
const REQUEST_SHARE_WEIGHT = 0.5;

/** Appended to the affinity key for decode, so P and D spread independently of each other. */
export const DECODE_KEY_DISCRIMINATOR = ":decode";

/** The key a role ranks with: the request key for prefill, the key + discriminator for decode. */
export function roleKey(key: string | null, role: Role): string | null {
  if (key === null) return null;
  return role === "decode" ? key + DECODE_KEY_DISCRIMINATOR : key;
}

export interface Pool {
  role: Role;
  policy: PolicyName;
  nodes: CandidateNode[];
  key: string | null;
  cursor: number;
  sticky: string | undefined;
  pinned: boolean;
  matches: Record<string, number>;
  blockCount: number;
  loadFactor: number;
  loadSlack: number;
  cacheLoadFactor: number;
  shareFactor: number;
  /** the decode KV guard; null for prefill and for requests it does not apply to */
  guard: GuardSettings | null;
  /** the prompt's characters (0: unknown) and the prefix blocks' size: each candidate's uncached tokens */
  promptChars: number;
  blockChars: number;
  /** this request's share of work in the unit `recent` counts (tokens): the "+1" of the share bound */
  requestWork: number;
}

export function poolOf(input: SelectionInput, role: Role): Pool {
  return {
    role,
    policy: input.policy[role],
    nodes: input[role],
    key: roleKey(input.key, role),
    cursor: input.cursors[role],
    sticky: input.sticky?.[role],
    pinned: input.pinned === true,
    matches: input.prefixMatches[role],
    blockCount: input.prefixBlockCount,
    loadFactor: input.policy.loadFactor,
    loadSlack: input.policy.loadSlack,
    cacheLoadFactor: input.policy.cacheAware.loadFactor,
    shareFactor: input.policy.cacheAware.shareFactor,
    guard: role === "decode" ? (input.guard ?? null) : null,
    promptChars: input.promptChars ?? 0,
    blockChars: input.policy.cacheAware.blockChars,
    requestWork: Math.max(1, promptTokensOf(input.promptChars ?? 0)),
  };
}

export interface Ranked {
  kind: "ok";
  decision: RoleDecision;
  /** available, in-scope nodes under their bound, in the policy's order (the chosen one included) */
  preferred: string[];
  /**
   * cache_aware: nodes under the in-flight bound but over their share of the work recently routed,
   * in the policy's order. Predicted disaggregation weighs them too: it prices a node's queue
   * itself, and the share bound would otherwise take a conversation's warm node from it.
   */
  overShare: string[];
  usedRoundRobin: boolean;
  /** the load each node was weighed with (in-flight requests weighted by their tokens, plus the KV barrier) */
  effective: Map<string, number>;
}

/**
 * `empty`: the pool has no node; `none_in_group`: the group filter left nothing usable; `busy`:
 * some node may take work but every one of them is busy (decode KV guard).
 */
export type RankOutcome = Ranked | { kind: "empty" } | { kind: "none_in_group" } | { kind: "busy"; candidates: ScoredCandidate[] };

export const isAvailable = (n: CandidateNode): boolean => n.healthy && !n.drain;
export const weightOf = (n: CandidateNode): number => (n.weight > 0 ? n.weight : 1);
export const round3 = (x: number): number => Math.round(x * 1000) / 1000;

/** The guard's figures on a decode candidate, as /v1/route shows them. */
function withSignals(c: ScoredCandidate, n: CandidateNode, busy: boolean, barrier: number): void {
  const s = n.signals ?? null;
  c.kvUsage = s?.kvUsage ?? null;
  c.queue = s?.queue ?? null;
  c.signalsAgeMs = s ? s.ageMs : null;
  c.busy = busy;
  // infinite only at a full cache, which is always busy
  if (Number.isFinite(barrier)) c.kvBarrier = round3(barrier);
}

/**
 * Ranks one role's pool by its policy and picks a node. `group` restricts the pick to one group
 * (pdGroup strict); out-of-group nodes are still listed, marked skipped "group".
 */
export function rankRole(pool: Pool, group?: string): RankOutcome {
  const { nodes } = pool;
  if (nodes.length === 0) return { kind: "empty" };
  const inScope = (n: CandidateNode): boolean => group === undefined || n.group === group;
  const scope = nodes.filter(inScope);
  const guard = pool.guard;
  // busy for this request: inside the window a 503/429 asked for, or (decode) a node this request's prompt would take to kvBusy
  const busy = (n: CandidateNode): boolean => n.busy === true || (guard !== null && isBusyFor(n, guard, promptTokensOf(pool.promptChars, n.charsPerToken)));
  /** may take new work: available and not busy */
  const open = (n: CandidateNode): boolean => isAvailable(n) && !busy(n);
  const eligible = (n: CandidateNode): boolean => open(n) && inScope(n);
  // KV pressure counts as extra in-flight requests wherever load is weighed (kv-guard.ts), and
  // in-flight requests count by their tokens (work.ts): over the nodes that may take work the
  // weighted counts sum to the plain count, so the bounds below keep their meaning
  const barrier = (n: CandidateNode): number => (guard === null ? 0 : kvBarrier(n));
  const weighted = new Map<string, number>();
  const weights = workWeightedLoads(nodes, nodes.map(open));
  for (const [i, n] of nodes.entries()) weighted.set(n.id, weights[i] ?? Math.max(0, n.load));
  const loadOf = (n: CandidateNode): number => (weighted.get(n.id) ?? Math.max(0, n.load)) + barrier(n);
  if (scope.length === 0) return { kind: "none_in_group" };

  const usesKey = pool.policy === "affinity" || pool.policy === "cache_aware";
  const policy: PolicyName = usesKey && pool.key === null ? "round_robin" : pool.policy;
  const bounded = policy === "affinity" || policy === "cache_aware";

  // Load totals over the nodes that may take new work (all groups: load is a pool-wide picture).
  // Over exactly that set the bounds sum to more than its load, so some node is under its bound.
  let totalLoad = 0;
  let totalWeight = 0;
  let totalRecent = 0;
  let totalRequests = 0;
  for (const n of nodes) {
    if (!open(n)) continue;
    totalLoad += loadOf(n);
    totalWeight += n.weight;
    totalRecent += Math.max(0, n.recent ?? 0);
    totalRequests += Math.max(0, n.recentRequests ?? 0);
  }
  // The recent share in work: the tokens a node was given lately, plus for each request half the
  // pool's mean tokens a request — a request costs its node more than its prefill (it holds KV and
  // decodes), so a node given many cheap warm turns is not taken for idle. One measure, summed
  // over the same nodes as the totals, so the share bounds below still sum past the total.
  const meanWork = totalRequests > 0 ? (REQUEST_SHARE_WEIGHT * totalRecent) / totalRequests : 0;
  const recentOf = (n: CandidateNode): number => Math.max(0, n.recent ?? 0) + meanWork * Math.max(0, n.recentRequests ?? 0);
  const totalShare = totalRecent + meanWork * totalRequests;
  /** the recent share per unit of weight (cache_aware's and least_load's tie-break) */
  const shareOf = (n: CandidateNode): number => recentOf(n) / weightOf(n);
  const cacheAware = policy === "cache_aware";
  const loadFactor = cacheAware ? pool.cacheLoadFactor : pool.loadFactor;
  // A node outside that set (a draining sticky node) is measured as if it were one more member.
  // The slack applies to cache_aware's in-flight bound too: moving a conversation off its cache
  // on a lightly loaded cluster costs a whole prefill for nothing.
  const boundOf = (n: CandidateNode): number =>
    open(n)
      ? loadBound(n.weight, totalWeight, totalLoad, loadFactor, pool.loadSlack)
      : loadBound(n.weight, totalWeight + n.weight, totalLoad + loadOf(n), loadFactor, pool.loadSlack);
  // cache_aware's share bound: the same construction over the work recently routed (tokens), so
  // the bounds again sum to more than the total and some node is always under its own. Every node
  // may also be one such request over its share (the request's own size, like loadSlack for
  // in-flight load): on a lightly loaded cluster one long cold prompt would otherwise put its node
  // over the share, and the conversation's next turn would leave the node holding its cache.
  const slack = pool.requestWork + meanWork;
  const shareBoundOf = (n: CandidateNode): number => {
    const weight = open(n) ? totalWeight : totalWeight + n.weight;
    const recent = open(n) ? totalShare : totalShare + recentOf(n);
    return weight > 0 ? (pool.shareFactor * (recent + slack) * n.weight) / weight + slack : Infinity;
  };
  const underShare = (n: CandidateNode): boolean => !cacheAware || recentOf(n) < shareBoundOf(n);
  const underOwnBound = (n: CandidateNode): boolean => !bounded || (loadOf(n) < boundOf(n) && underShare(n));

  const rendezvous = new Map<string, number>();
  if (pool.key !== null && policy !== "round_robin") {
    for (const n of nodes) rendezvous.set(n.id, rendezvousScore(pool.key, n));
  }
  const byRendezvous = (a: CandidateNode, b: CandidateNode): number => (rendezvous.get(b.id) ?? 0) - (rendezvous.get(a.id) ?? 0) || compareIds(a.id, b.id);

  // Session stickiness: the conversation's previous node keeps it, even while draining, unless busy.
  // A pinned request (its node holds state it needs) keeps the node whatever the policy, bound and KV.
  // Under cache_aware it keeps it only among the nodes holding the longest prefix: a key shared by
  // many conversations (a common system prompt in a completions prompt's first blocks) must not
  // pull them all onto the node that served the last of them, away from the nodes holding their own.
  const matchedOf = (n: CandidateNode): number => Math.max(0, Math.min(pool.matches[n.id] ?? 0, pool.blockCount));
  const longestMatch = policy === "cache_aware" ? Math.max(0, ...scope.filter((n) => open(n)).map(matchedOf)) : 0;
  if ((usesKey || pool.pinned) && pool.sticky !== undefined) {
    const sticky = nodes.find((n) => n.id === pool.sticky);
    const holdsLongest = sticky !== undefined && (policy !== "cache_aware" || matchedOf(sticky) >= longestMatch);
    if (sticky?.healthy && inScope(sticky) && (pool.pinned || (!busy(sticky) && underOwnBound(sticky) && holdsLongest))) {
      const order = policyOrder(pool, policy, nodes, inScope, byRendezvous, loadOf, shareOf);
      return finish(order, sticky, "sticky", false);
    }
  }

  const ready = scope.filter(isAvailable);
  if (ready.length === 0) {
    // Walk on to another group (strict) while some node elsewhere may take work.
    if (group !== undefined && nodes.some(isAvailable)) return { kind: "none_in_group" };
    return failOpen();
  }
  const free = ready.filter((n) => !busy(n));
  if (free.length === 0 && guard !== null) {
    // Every node that could serve is busy: the request waits at the edge (admission queue).
    // Without a queue (prefill, one hop) the busy ones are taken, least loaded first.
    const order = policyOrder(pool, policy, nodes, inScope, byRendezvous, loadOf, shareOf);
    return { kind: "busy", candidates: finish(order, null, policy, false).decision.candidates };
  }

  const order = policyOrder(pool, policy, nodes, inScope, byRendezvous, loadOf, shareOf);
  let chosen = order.nodes.find((n) => eligible(n) && underOwnBound(n));
  let rule: DecisionRule = policy;
  if (chosen === undefined) {
    // Every candidate is at its bound: possible only inside one group (strict) or with
    // loadFactor < 1. Take the least loaded rather than refuse.
    chosen = [...(free[0] ? free : ready)].sort((a, b) => loadOf(a) / weightOf(a) - loadOf(b) / weightOf(b))[0] as CandidateNode;
    if (policy === "affinity") rule = "affinity_bounded_skip";
  } else if (policy === "affinity") {
    const before = order.nodes.slice(0, order.nodes.indexOf(chosen));
    if (before.some((n) => eligible(n) && !underOwnBound(n))) rule = "affinity_bounded_skip";
  }
  return finish(order, chosen, rule, policy === "round_robin");

  function finish(order: PolicyOrder, pick: CandidateNode | null, why: DecisionRule, usedRoundRobin: boolean): Ranked {
    const ordered = order.nodes;
    const candidates = ordered.map((n): ScoredCandidate => {
      const c = candidate(n);
      if (bounded) c.bound = boundOf(n);
      withRendezvous(c);
      const terms = order.terms?.get(n.id);
      if (terms) {
        c.matchedBlocks = terms.matched;
        c.score = terms.score;
        c.recent = round3(recentOf(n));
        c.shareBound = round3(shareBoundOf(n));
        if (n.recentRequests !== undefined) c.recentRequests = round3(n.recentRequests);
      }
      if (n !== pick) {
        const skipped = skipReason(n);
        if (skipped) c.skipped = skipped;
      }
      return c;
    });
    const preferred = ordered.filter((n) => eligible(n) && underOwnBound(n)).map((n) => n.id);
    const overBound = ordered.filter((n) => eligible(n) && !underOwnBound(n)).map((n) => n.id);
    // a busy node is a last resort for a failover: better than an error once the request is under way
    const busyOnes = ordered.filter((n) => isAvailable(n) && inScope(n) && busy(n)).map((n) => n.id);
    const fallbacks = [...preferred, ...overBound, ...busyOnes].filter((id) => id !== pick?.id);
    const overShare = ordered.filter((n) => eligible(n) && bounded && loadOf(n) < boundOf(n) && !underShare(n)).map((n) => n.id);
    return ranked({ id: pick?.id ?? "", rule: why, candidates, fallbacks, failOpen: false }, preferred, usedRoundRobin, overShare);
  }

  function ranked(decision: RoleDecision, preferred: string[], usedRoundRobin: boolean, overShare: string[] = []): Ranked {
    return { kind: "ok", decision, preferred, overShare, usedRoundRobin, effective: new Map(nodes.map((n) => [n.id, loadOf(n)])) };
  }

  /** A node as /v1/route shows it: its state, the guard's figures, in-flight tokens, the load weighed, and what it lacks of this prompt. */
  function candidate(n: CandidateNode): ScoredCandidate {
    const c: ScoredCandidate = { id: n.id, load: n.load, healthy: n.healthy, drain: n.drain, group: n.group };
    if (guard !== null) withSignals(c, n, busy(n), barrier(n));
    else if (n.busy) c.busy = true;
    if (n.work !== undefined) c.loadTokens = n.work;
    const effective = loadOf(n);
    if (Number.isFinite(effective)) c.effectiveLoad = round3(effective);
    if (pool.promptChars > 0) c.uncachedTokens = uncachedTokensOf(pool.promptChars, pool.matches[n.id] ?? 0, pool.blockChars, n.charsPerToken);
    return c;
  }

  function withRendezvous(c: ScoredCandidate): void {
    const rv = rendezvous.get(c.id);
    if (rv !== undefined) c.rendezvous = rv;
  }

  function skipReason(n: CandidateNode): ScoredCandidate["skipped"] {
    if (!n.healthy) return "unhealthy";
    if (!inScope(n)) return "group";
    if (n.drain) return "draining";
    if (busy(n)) return "busy";
    if (bounded && loadOf(n) >= boundOf(n)) return "over_bound";
    if (!underShare(n)) return "over_share";
    return undefined;
  }

  /**
   * No node in scope may take work: rather than refusing, take the one that failed least recently
   * (healthy draining nodes first, when all that is left is draining).
   */
  function failOpen(): Ranked {
    const healthy = scope.filter((n) => n.healthy);
    const pick = healthy.length > 0 ? healthy : scope;
    const byFailure = [...pick].sort((a, b) => a.lastFailureAt - b.lastFailureAt || byRendezvous(a, b));
    const rest = nodes.filter((n) => !pick.includes(n)).sort((a, b) => compareIds(a.id, b.id));
    const chosenNode = byFailure[0] as CandidateNode;
    const candidates = [...byFailure, ...rest].map((n): ScoredCandidate => {
      const c = candidate(n);
      withRendezvous(c);
      if (n !== chosenNode) c.skipped = !inScope(n) ? "group" : !n.healthy ? "unhealthy" : "draining";
      return c;
    });
    return ranked({ id: chosenNode.id, rule: "fail_open", candidates, fallbacks: byFailure.slice(1).map((n) => n.id), failOpen: true }, [], false);
  }
}

interface PolicyOrder {
  nodes: CandidateNode[];
  terms?: Map<string, { matched: number; score: number }>;
}

/** Every node of the pool in the policy's order, best first. `loadOf`: in-flight plus the KV barrier. */
function policyOrder(
  pool: Pool,
  policy: PolicyName,
  nodes: CandidateNode[],
  inScope: (n: CandidateNode) => boolean,
  byRendezvous: (a: CandidateNode, b: CandidateNode) => number,
  loadOf: (n: CandidateNode) => number,
  shareOf: (n: CandidateNode) => number,
): PolicyOrder {
  switch (policy) {
    case "round_robin": {
      // The cycle is the available in-scope nodes by id; the cursor picks where it starts.
      const byId = [...nodes].sort((a, b) => compareIds(a.id, b.id));
      const cycle = byId.filter((n) => isAvailable(n) && inScope(n));
      const rest = byId.filter((n) => !cycle.includes(n));
      // the cursor only counts up from 0, one a request
      const start = cycle.length === 0 ? 0 : pool.cursor % cycle.length;
      return { nodes: [...cycle.slice(start), ...cycle.slice(0, start), ...rest] };
    }
    case "affinity":
      return { nodes: [...nodes].sort(byRendezvous) };
    case "least_load":
      // Ties (idle nodes) go to the smallest recent share first: a rendezvous order alone would
      // hand every tie to the same nodes whenever requests share a key (a common system prompt).
      return { nodes: [...nodes].sort((a, b) => loadOf(a) / weightOf(a) - loadOf(b) / weightOf(b) || shareOf(a) - shareOf(b) || byRendezvous(a, b)) };
    case "cache_aware": {
      // Longest cached prefix first: a block found is a block not prefilled again. Load enters
      // as hard limits (in-flight and recent-share bounds, applied by the caller), not as a
      // discount on the match, which would trade hits for a balance the bounds already keep.
      // Equal matches (nothing held, or only a system prompt every node holds) go to the node
      // with the smallest recent share, then rendezvous order on the conversation key.
      const terms = new Map<string, { matched: number; score: number }>();
      for (const n of nodes) {
        const matched = Math.max(0, Math.min(pool.matches[n.id] ?? 0, pool.blockCount));
        terms.set(n.id, { matched, score: pool.blockCount > 0 ? matched / pool.blockCount : 0 });
      }
      const matchedOf = (n: CandidateNode): number => terms.get(n.id)?.matched ?? 0;
      return {
        nodes: [...nodes].sort((a, b) => matchedOf(b) - matchedOf(a) || shareOf(a) - shareOf(b) || byRendezvous(a, b)),
        terms,
      };
    }
  }
}

export function nodeById(nodes: readonly CandidateNode[], id: string): CandidateNode | undefined {
  return nodes.find((n) => n.id === id);
}

export function fail<T>(error: SelectionError): Result<T, SelectionError> {
  return { ok: false, error };
}
