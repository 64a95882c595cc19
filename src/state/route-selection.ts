import type { CandidateNode, Decision, GuardSettings, Role, SelectionInput, SelectionPolicy } from "../routing/types";
import type { BoundedMap } from "./bounded-map";
import { signalsOf } from "./cluster-settings";
import type { RoundRobinCursors } from "./cursors";
import type { EngineSignals } from "./engine-signals";
import { isHealthy } from "./health";
import type { NodeHealthTable } from "./health-table";
import { type LeaseTable, leaseKvTokens } from "./leases";
import { type NodeRateTable, profileOf, type RateProfile } from "./node-rates";
import type { PrefixMemory } from "./prefix-memory";
import type { RecentShare } from "./recent-share";
import type { ClusterView, RouteRequest } from "./types";

// The object's side of the pure selection core (src/routing/select.ts): what it is given for one
// request, from what the modules hold now, and what of its decision the Worker is answered.

/** A conversation's remembered P and D (session stickiness). */
export interface StickyPair {
  prefill: string;
  decode: string;
}

/** The object's modules that selection reads, passed as they are (one record, built once). */
export interface RouteSources {
  health: NodeHealthTable;
  leases: LeaseTable;
  signals: EngineSignals;
  recent: RecentShare;
  prefixes: PrefixMemory;
  sticky: BoundedMap<StickyPair>;
  cursors: RoundRobinCursors;
  rates: NodeRateTable;
}

type ViewNode = ClusterView["nodes"][number];

/** One hop to one node: a colocated cluster, or a request that needs only one (embeddings, tokenizer). */
export const isColocated = (cluster: ClusterView, req: RouteRequest): boolean => cluster.protocol === "colocated" || req.oneHop === true;

export const usesCacheAware = (policy: SelectionPolicy): boolean => policy.prefill === "cache_aware" || policy.decode === "cache_aware";

/** Conditional or predicted disaggregation: they ask what each node holds, whatever the policy. */
export const decidesPerRequest = (policy: SelectionPolicy): boolean => policy.disaggregation === "conditional" || policy.disaggregation === "predicted";

/**
 * The request's prefix blocks are looked up in the index and recorded after: cache_aware, or
 * conditional or predicted disaggregation, which ask what D (and P) hold whatever the policy.
 */
export const usesPrefixIndex = (cluster: ClusterView, req: RouteRequest, colocated: boolean): boolean =>
  (usesCacheAware(cluster.policy) || (!colocated && decidesPerRequest(cluster.policy))) && req.prefixHashes.length > 0;

/**
 * What the pure selection core (src/routing/select.ts) is given for one request: each pool's
 * candidates as the modules see them now, built in one pass over the nodes; the prefix matches;
 * the sticky pair; the cursors; the decode KV guard unless `guarded` is false.
 */
export function routeInput(req: RouteRequest, cluster: ClusterView, now: number, guarded: boolean, m: RouteSources): SelectionInput {
  const s = signalsOf(cluster);
  const colocated = isColocated(cluster, req);
  const prefill: CandidateNode[] = [];
  const decode: CandidateNode[] = [];
  const predicted = !colocated && cluster.policy.disaggregation === "predicted";
  for (const n of cluster.nodes) {
    // no model (SGLang's /generate, a tokenizer call without one): any node
    if (n.models && req.model && !n.models.includes(req.model)) continue;
    if (!colocated && n.role !== "decode") prefill.push(candidateOf(n, "prefill", now, s.staleMs, m, predicted));
    if (n.role !== "prefill") decode.push(candidateOf(n, "decode", now, s.staleMs, m, predicted));
  }
  const indexed = usesPrefixIndex(cluster, req, colocated);
  // the learned rates only where they decide (they cost a few multiplications a node)
  if (predicted) {
    const profiles = profilesOf(cluster);
    for (const n of prefill) n.rates = m.rates.view(n.id, profiles.get(n.id) ?? profileOf(cluster.profile, undefined), now);
    for (const n of decode) n.rates = m.rates.view(n.id, profiles.get(n.id) ?? profileOf(cluster.profile, undefined), now);
  }
  return {
    policy: cluster.policy,
    colocated,
    prefill,
    decode,
    key: req.key,
    prefixMatches: {
      prefill: indexed ? m.prefixes.match("prefill", req.prefixHashes, prefill) : {},
      decode: indexed ? m.prefixes.match("decode", req.prefixHashes, decode) : {},
    },
    prefixBlockCount: req.prefixHashes.length,
    sticky: req.key ? (m.sticky.get(req.key) ?? null) : null,
    pinned: req.pinned === true,
    cursors: { ...m.cursors },
    guard: guarded ? guardOf(s, predicted, req.tier === "priority" ? 0 : (cluster.admission?.priorityReserve ?? 0)) : null,
    promptChars: req.promptChars ?? 0,
  };
}

/**
 * The decode KV guard's settings; `predicted` prices the prefill legs on a node, so its queue test
 * leaves them out (routing/kv-guard.ts). `reserve`: the KV kept for priority requests, taken off
 * kvBusy for the others (admission.priorityReserve).
 */
const guardOf = (s: { kvBusy: number; queueBusy: number }, predicted: boolean, reserve: number): GuardSettings => {
  const kvBusy = Math.max(0.01, s.kvBusy - reserve);
  return predicted ? { kvBusy, queueBusy: s.queueBusy, pricesPrefills: true } : { kvBusy, queueBusy: s.queueBusy };
};

/** Per view: each node's prior rates (its profile over the pool's), computed once. */
const profilesByView = new WeakMap<ClusterView, Map<string, RateProfile>>();

function profilesOf(cluster: ClusterView): Map<string, RateProfile> {
  let profiles = profilesByView.get(cluster);
  if (!profiles) {
    profiles = new Map(cluster.nodes.map((n) => [n.id, profileOf(cluster.profile, n.profile)]));
    profilesByView.set(cluster, profiles);
  }
  return profiles;
}

/**
 * One node as selection sees it in one role: its health, lease load, signals, rate and recent
 * share. `predicted`: its engine queue is projected by the prefill legs sent and ended since the
 * poll too (those it is given as a P are priced, and left out of the guard's queue test).
 */
export function candidateOf(n: ViewNode, role: Role, now: number, staleMs: number, m: RouteSources, predicted = false): CandidateNode {
  const h = m.health.view(n.id);
  const load = m.leases.loadOf(n.id);
  return {
    // P's signals weigh nowhere in its ranking; conditional disaggregation reads its queue (prefill_busy)
    signals: m.signals.view(n.id, now, staleMs, predicted ? (load?.prefill ?? 0) : undefined, leaseKvTokens(load)),
    id: n.id,
    weight: n.weight,
    group: n.group ?? `node:${n.id}`,
    load: load ? load[role] : 0,
    work: role === "prefill" ? (load?.prefillTokens ?? 0) : (load?.tokens ?? 0),
    prefillTokens: load?.prefillTokens ?? 0,
    prefillCost: load?.prefillCost ?? 0,
    prefillRequests: load?.prefill ?? 0,
    decoding: load?.decode ?? 0,
    decodingTokens: load?.tokens ?? 0,
    charsPerToken: m.prefixes.rates.of(n.id),
    localPrefill: n.localPrefill === true,
    healthy: isHealthy(h, now),
    busy: h.busyUntil > now,
    drain: n.drain,
    lastFailureAt: h.lastFailureAt,
    recent: m.recent.of(n.id, role),
    recentRequests: m.recent.requestsOf(n.id, role),
  };
}

/** The request needs only the picks: candidates and fallbacks stay in the object (the lease keeps the fallbacks). */
export const slimDecision = (d: Decision): Decision => ({ ...d, prefill: slimRole(d.prefill), decode: slimRole(d.decode) });

const slimRole = (d: Decision["prefill"]): Decision["prefill"] => ({ ...d, candidates: [], fallbacks: [] });
