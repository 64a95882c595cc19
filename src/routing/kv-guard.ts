// The decode KV guard (SPEC 8), pure. A decode node is busy when the engine's projected KV use is
// at or above `kvBusy` or its queue at or above `queueBusy`: it gets no new request while a
// node that is not busy can serve. Among the rest, KV use weighs in as a barrier.
import type { CandidateNode, GuardSettings } from "./types";

/** Busy: a fresh projection at or past a threshold. No fresh signals: never busy (fail open). */
export function isBusy(n: Pick<CandidateNode, "signals" | "prefillRequests">, guard: GuardSettings): boolean {
  const s = n.signals;
  if (!s) return false;
  const queue = guardedQueue(n, guard);
  return (s.kvUsage !== null && s.kvUsage >= guard.kvBusy) || (queue !== null && queue >= guard.queueBusy);
}

/**
 * The engine queue the guard judges. Under `predicted` (guard.pricesPrefills) the prefill legs the
 * router has in flight on the node are left out: the prediction already charges every option for
 * them (predict.ts queuedTokens), and on a `both` node they are its work as a P — counting them
 * made a node busy as a D for the prefills it was given as a P, and with every node so judged the
 * requests waited at the edge while the prediction would have placed them.
 */
export function guardedQueue(n: Pick<CandidateNode, "signals" | "prefillRequests">, guard: GuardSettings): number | null {
  const queue = n.signals?.queue ?? null;
  if (queue === null || guard.pricesPrefills !== true) return queue;
  return Math.max(0, queue - Math.max(0, n.prefillRequests ?? 0));
}

/**
 * Busy for one request of `tokens` prompt tokens: busy already, or the request's tokens would take
 * the node's projected KV use to `kvBusy` — a decode node holds the whole prompt of every request
 * it runs, and in an agentic workload one prompt can be half a node's KV, so a node just under
 * `kvBusy` given it lands at the wall (Dynamo's decode-busy gate counts the request's own blocks:
 * ai-dynamo/dynamo lib/kv-router/src/conditional_disagg.rs). Needs the engine's reported KV
 * capacity; a request that alone is `kvBusy` of the capacity or more is judged by the node's
 * state alone (no node could ever take it otherwise).
 */
export function isBusyFor(n: Pick<CandidateNode, "signals" | "prefillRequests">, guard: GuardSettings, tokens: number): boolean {
  if (isBusy(n, guard)) return true;
  const s = n.signals;
  if (!s || s.kvUsage === null || !s.kvCapacityTokens || !(s.kvCapacityTokens > 0)) return false;
  const share = Math.max(0, tokens) / s.kvCapacityTokens;
  return share < guard.kvBusy && s.kvUsage + share >= guard.kvBusy;
}

/** KV use below which a node counts as under no memory pressure at all (k / (1 - k) < 0.053 requests). */
export const KV_QUIET = 0.05;

/**
 * KV use as extra in-flight requests: k / (1 - k) from KV_QUIET up. 0 at an empty cache, 1 at half
 * full, 4 at 0.8, 9 at 0.9, without bound as k nears 1. The barrier is added to the node's in-flight count wherever
 * a policy weighs load — bounded load's check and totals (affinity, cache_aware, the sticky check)
 * and least_load's order — so each policy keeps its meaning: affinity and cache_aware still take
 * their node until its load plus the barrier reaches its bound, and the bounds, computed over the
 * same sums, still leave some node under its own. Same form and unit as SGLang's lightweight PD
 * router's load score (`work + lambda * token_usage / (1 - token_usage)`, work in requests,
 * lambda 1 by default, token_usage polled from the engines every 5 s).
 */
export function kvBarrier(n: Pick<CandidateNode, "signals">): number {
  const k = n.signals?.kvUsage;
  // below KV_QUIET (a barrier under 0.053 of a request) it is 0: a difference that small must not
  // order nodes whose in-flight load is equal, or an idle cluster leaves its pdGroup because a poll
  // caught one D mid-request (SPEC 5: an idle cluster stays in its group)
  if (k === null || k === undefined || !(k >= KV_QUIET)) return 0;
  return k >= 1 ? Infinity : k / (1 - k);
}
