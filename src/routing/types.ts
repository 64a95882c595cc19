// Plain data shared by the pure selection core, the Durable Object and the routes.
// Nothing here touches env, fetch or the clock (STYLE.md: pure core, thin shell).
import type { NodeRates } from "./predict";

export type Role = "prefill" | "decode";
export type PolicyName = "round_robin" | "affinity" | "cache_aware" | "least_load";
export type PdGroupMode = "off" | "prefer" | "strict";

export interface CacheAwareParams {
  /** characters a prefix block holds (the index and the request must agree) */
  blockChars: number;
  /**
   * in-flight bound for cache_aware (same formula as `loadFactor`): looser than affinity's,
   * because moving a conversation off its cache costs a full prefill elsewhere
   */
  loadFactor: number;
  /**
   * share bound: a node may take a request only while its share of the recently routed
   * requests is below `shareFactor` x its weight's share — keeps requests per node even
   * while the longest cached prefix decides
   */
  shareFactor: number;
  /** requests after which a routed request counts half in the recent share */
  shareHalfLife: number;
  /** prefix blocks one request may add to the index (its first N) */
  maxBlocksPerRequest: number;
}

export interface SelectionPolicy {
  prefill: PolicyName;
  decode: PolicyName;
  /**
   * SPEC 8: `always` disaggregates every request; `conditional` picks D first and prefills on D
   * alone when the prompt's uncached tokens there are few (absent in views saved before it: always)
   */
  disaggregation?: "always" | "conditional" | "predicted" | undefined;
  /**
   * conditional: prefill on D alone only below this many uncached tokens ... (a view saved before
   * these fields has no `disaggregation` either, so it never reads them)
   */
  localPrefillTokens: number;
  /** ... and below this share of the prompt */
  localPrefillRatio: number;
  pdGroup: PdGroupMode;
  pdGroupBonus: number;
  loadFactor: number;
  /**
   * extra in-flight requests every node may take above its bounded-load share (SPEC 5), so a
   * lightly loaded cluster does not split conversations; 0 is the strict rule
   */
  loadSlack: number;
  cacheAware: CacheAwareParams;
}

/** One node as the selection core sees it, for one role. */
export interface CandidateNode {
  id: string;
  weight: number;
  /** resolved group: the node's `group`, or a group of its own when it has none */
  group: string;
  /** in-flight requests on this node in this role */
  load: number;
  /** may take new work: probes up, breaker closed (or half-open trial due) */
  healthy: boolean;
  /** draining: no new conversations, but sticky ones stay */
  drain: boolean;
  /** the node answered 503/429 and the time it asked to be left alone has not passed: busy like the KV guard's */
  busy?: boolean;
  /** epoch ms of the node's last failure, 0 if none (fail-open picks the least recent) */
  lastFailureAt: number;
  /** work recently routed to this node in this role (decayed tokens; cache_aware's share) */
  recent?: number;
  /** requests recently routed to this node in this role (decayed count; cache_aware's request share) */
  recentRequests?: number;
  /** the engine's own figures, projected to now; absent or null without a fresh poll (never busy then) */
  signals?: NodeSignals | null;
  /**
   * in-flight work in this role, in tokens: uncached prefill tokens of the prefill legs running on
   * it (prefill), KV tokens of the decode streams open on it (decode). Absent: load counts requests.
   */
  work?: number;
  /** characters a token of this node's tokenizer (learned from its answers); absent: 4 */
  charsPerToken?: number;
  /** may prefill a request alone as a decode node (conditional disaggregation); absent: false */
  localPrefill?: boolean;
  /** learned rates (predicted disaggregation; absent: not predicted) */
  rates?: NodeRates;
  /** prefill tokens running on the node and their requests, whatever role ran them (a local prefill's D too) */
  prefillTokens?: number;
  prefillRequests?: number;
  /** those prefills' cost in tokens at context 0 (each at its own context: state/leases.ts prefillCostOf) */
  prefillCost?: number;
  /** sequences decoding on the node (its decode leases), and their prompt tokens */
  decoding?: number;
  decodingTokens?: number;
}

/** What the engine reported (KV use and queue), projected by what was sent since; ageMs: how old the poll is. */
export interface NodeSignals {
  kvUsage: number | null;
  queue: number | null;
  ageMs: number;
  /** the engine's KV capacity in tokens, when it reports one (projects this request's tokens onto kvUsage) */
  kvCapacityTokens?: number | null;
}

/** The decode KV guard's thresholds (`signals.kvBusy`, `signals.queueBusy`). */
export interface GuardSettings {
  kvBusy: number;
  queueBusy: number;
  /**
   * `predicted`: the queue test leaves out the prefill legs the router has in flight on the node
   * (their tokens are in the prediction's queue already; on a `both` node they are its P work,
   * not decode requests waiting). Absent: the engine's whole queue counts.
   */
  pricesPrefills?: boolean;
}

export interface SelectionInput {
  policy: SelectionPolicy;
  /** colocated: one hop, the decode pool's pick serves both legs */
  colocated: boolean;
  prefill: CandidateNode[];
  decode: CandidateNode[];
  /** hex SHA-256 of the affinity key material, null when the request has none */
  key: string | null;
  /** cache_aware: number of leading prefix blocks each node is believed to hold, by role */
  prefixMatches: { prefill: Record<string, number>; decode: Record<string, number> };
  /** cache_aware: how many prefix blocks the request has */
  prefixBlockCount: number;
  /** the conversation's previous P and D (session stickiness), if remembered */
  sticky: { prefill?: string; decode?: string } | null;
  /**
   * The remembered nodes hold state the request needs (a stored response): they are taken
   * whatever the policy and load bound, while healthy.
   */
  pinned?: boolean;
  /** round-robin cursors per pool (monotonic counters) */
  cursors: { prefill: number; decode: number };
  /** the decode KV guard (decode nodes only); absent: no guard (one-hop requests) */
  guard?: GuardSettings | null;
  /**
   * characters of the prompt as the prefix blocks see it (canonical text); 0 when unknown. With each
   * node's characters per token it gives the prompt's tokens, and with the prefix matches the
   * tokens a node has not cached: the work the request is for that node.
   */
  promptChars?: number;
}

/** Why a node was chosen; shown by POST /v1/route. */
export type DecisionRule =
  | "round_robin"
  | "affinity"
  | "affinity_bounded_skip"
  | "least_load"
  | "cache_aware"
  | "sticky"
  | "pdgroup_prefer"
  | "pdgroup_strict"
  | "colocated"
  /** conditional disaggregation: no P leg, D prefills the request itself */
  | "local_prefill"
  /** predicted disaggregation took another node than the policy's pick: predicted faster by the margin */
  | "predicted"
  | "fail_open";

export interface ScoredCandidate {
  id: string;
  load: number;
  healthy: boolean;
  drain: boolean;
  group: string;
  /** load bound this node had for this request (bounded load), if the policy uses one */
  bound?: number;
  /** rendezvous score (higher ranks first), if the policy uses one */
  rendezvous?: number;
  /** cache_aware terms: leading prefix blocks held, their fraction, recent share and its bound */
  matchedBlocks?: number;
  score?: number;
  recent?: number;
  shareBound?: number;
  /** requests recently routed (the share counts each as the pool's mean work besides its own tokens) */
  recentRequests?: number;
  /** decode KV guard: the engine's projected KV use and queue (null without a fresh poll), the poll's age, busy */
  kvUsage?: number | null;
  queue?: number | null;
  signalsAgeMs?: number | null;
  busy?: boolean;
  /** KV use as extra in-flight requests, kvUsage / (1 - kvUsage) (0 without signals) */
  kvBarrier?: number;
  /** in-flight work in tokens (uncached prefill tokens on P, KV tokens on D), when known */
  loadTokens?: number;
  /** the load bounded load and least_load weighed: in-flight requests weighted by their tokens, plus the KV barrier */
  effectiveLoad?: number;
  /** the prompt's tokens this node is predicted not to hold (its prefill work for this request) */
  uncachedTokens?: number;
  /** predicted disaggregation: the node's learned rates (prefill ms a token at context 0, decode step of one sequence and ms a further sequence, transfer ms a GB) */
  prefillMsPerToken?: number;
  decodeStepMs?: number;
  decodeMsPerSeq?: number;
  transferMsPerGB?: number;
  /** D's hand-off after P's answer that does not grow with the tokens (ms) */
  handoffMs?: number;
  /** predicted TTFT (ms) of the best option through this node (P: with the best D; D: the best P, then this D) */
  predictedTtftMs?: number;
  /** D: predicted TTFT of prefilling alone, and the decode harm that adds (null: not an option here) */
  localTtftMs?: number | null;
  decodeHarmMs?: number;
  /** D: what decoding the request here costs over the least loaded D (ms summed over sequences) */
  decodeLoadMs?: number;
  /** the node was passed over, and why */
  skipped?: "unhealthy" | "draining" | "busy" | "over_bound" | "over_share" | "group";
}

export interface RoleDecision {
  id: string;
  rule: DecisionRule;
  /** every candidate of the pool in the order the policy ranked them */
  candidates: ScoredCandidate[];
  /** ids to fail over to, best first, the chosen one excluded */
  fallbacks: string[];
  /** true when no healthy node existed and the least recently failed one was taken */
  failOpen: boolean;
}

/** How the request is served: P then D, D alone, or one hop (SPEC 8 `x-pd-mode`). */
export type PdMode = "disaggregated" | "local" | "colocated";
/** Why (SPEC 8 reasons). */
export type PdReason = "always" | "cached" | "cold" | "prefill_busy" | "decode_busy" | "no_local_prefill" | "pinned" | "predicted";

/** The request's size for the nodes picked, in tokens (each node's own characters per token). */
export interface DecisionTokens {
  /** the prompt on D (KV tokens D holds while it decodes); 0 when the prompt's size is unknown */
  prompt: number;
  /** tokens D was predicted to lack (null: no prefix information for D) */
  uncachedOnDecode: number | null;
  /** work of the prefill: uncached tokens on the node that prefills (P, or D when local / colocated) */
  prefillWork: number;
  /** work on D: the tokens it had to bring into its KV (computed or pulled) */
  decodeWork: number;
}

export interface Decision {
  prefill: RoleDecision;
  decode: RoleDecision;
  cursors: { prefill: number; decode: number };
  mode: PdMode;
  reason: PdReason;
  tokens: DecisionTokens;
  /** predicted disaggregation: the chosen option's predicted TTFT (ms) */
  predictedTtftMs?: number;
}

export type SelectionError =
  | { kind: "no_nodes"; role: Role }
  | { kind: "no_decode_in_group"; message: string }
  /** every decode node that could serve the request is busy (KV or queue): it waits at the edge */
  | { kind: "decode_busy"; candidates: ScoredCandidate[] };

export type Result<T, E> = { ok: true; value: T } | { ok: false; error: E };
