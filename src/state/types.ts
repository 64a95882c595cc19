import type { Decision, Role, SelectionError, SelectionPolicy } from "../routing/types";
import type { NodeReach } from "../config/schema";
import type { UsageDetailsVerdict } from "../observability/usage-details";
import type { AdmissionSettings } from "./admission-queue";
import type { EngineUsage } from "./cache-feedback";
import type { SignalSettings } from "./engine-signals";
import type { BreakerState, HealthSettings } from "./health";
import type { HistoryPoint } from "./node-history";
import type { RateProfile } from "../routing/predict";

/** The part of the cluster document the Durable Object needs; sent with every call that routes. */
export interface ClusterView {
  version: string;
  protocol: "vllm" | "vllm-mooncake" | "sglang" | "colocated";
  policy: SelectionPolicy;
  health: HealthSettings;
  /** absent in a view saved before signals existed: the defaults apply */
  signals?: SignalSettings | undefined;
  admission?: AdmissionSettings | undefined;
  /** SPEC 9 `profile`: the learned rates' prior for the pool (absent: the defaults) */
  profile?: Partial<RateProfile> | undefined;
  nodes: Array<{
    id: string;
    url: string;
    role: "prefill" | "decode" | "both";
    group?: string | undefined;
    weight: number;
    drain: boolean;
    models?: string[] | undefined;
    /** how the node is reached and its token's secret name, for the probes (src/forward/node-fetch.ts); absent in views stored before them */
    reach?: NodeReach | undefined;
    apiKeySecret?: string | undefined;
    /** may prefill a request alone as a decode node (conditional disaggregation; SPEC 8) */
    localPrefill?: boolean | undefined;
    /** this node's own prior rates, over the pool's */
    profile?: Partial<RateProfile> | undefined;
  }>;
}

export interface RouteRequest {
  /** version of the document the Worker routes with; the view itself only when the object asks for it */
  version: string;
  cluster?: ClusterView | undefined;
  model: string;
  /** hex SHA-256 of the affinity key material, or null */
  key: string | null;
  /** chained prefix block hashes (cache_aware or conditional disaggregation; empty otherwise) */
  prefixHashes: string[];
  /** estimated prompt tokens (body characters / 4): the lease's when the prompt's size is unknown */
  tokens: number;
  /** characters of the prompt's canonical text (routing/prefix-blocks.ts); 0 or absent when unknown */
  promptChars?: number;
  /** POST /v1/route: decide but take no lease, advance no cursor, record nothing */
  dryRun: boolean;
  /**
   * The lease id, chosen by the Worker before the call: if the client goes away while the
   * call is under way, the Worker can release the lease without having heard the answer.
   */
  leaseId?: string;
  /** the key's remembered nodes hold state the request needs (a stored response): keep them */
  pinned?: boolean;
  /** the request's id, named in the log line if its lease expires unreleased */
  requestId?: string;
  /** one hop to one decode-capable node (embeddings, tokenizer), whatever the protocol */
  oneHop?: boolean;
  /** the route's metric label (counted here if the lease expires unreleased) */
  route?: string;
}

/** Why a request that waited at the edge was not admitted. */
export type AdmissionError =
  /** every decode node is busy: the queue is full, or the request waited `queueMs` */
  | { kind: "cluster_busy"; reason: "queue_full" | "timeout"; retryAfterS: number }
  /** the request left the queue (its client left) */
  | { kind: "client_gone" };

export type RouteResponse =
  /** queuedMs: how long the request waited at the edge for a decode node that is not busy (absent: it did not) */
  | { ok: true; leaseId: string | null; decision: Decision; queuedMs?: number; wouldWait?: { queued: number } }
  | { ok: false; error: SelectionError | { kind: "stale_view" } | AdmissionError };

/**
 * How a leg ended, as far as the node's health is concerned. `busy`: the node answered 503/429
 * (full, not broken): failed over, counted neither as a failure nor as a success.
 */
export type LegOutcome = "ok" | "failure" | "client_error" | "aborted" | "busy";

export interface LegReport {
  node: string;
  outcome: LegOutcome;
  /** leg latency in ms (prefill: until P answered; decode: until D's first byte) */
  ms?: number;
  /** busy: how long the node asked to be left alone (its retry-after; absent or null: 1 s) */
  retryAfterMs?: number | null;
}

export interface FinishReport {
  route: string;
  /** remember these nodes under this key (hash): a later request presenting it is sticky to them */
  remember?: { key: string; prefill: string; decode: string };
  status: number;
  /** short hash of the client's API key, counted per key (never the key) */
  keyLabel?: string;
  /** whether P's answer carried prompt_tokens_details (observability/usage-details.ts) */
  usageDetails?: { node: string; reported: boolean };
  /**
   * the usage of the engine that prefilled (P under vllm / vllm-mooncake, D when it served alone):
   * compared with the router's prediction (cache-hit feedback; state/cache-feedback.ts)
   */
  engineUsage?: EngineUsage;
  prefill?: LegReport;
  decode?: LegReport;
  /** what the Worker measured of a request that was answered (learned rates, prediction ratio) */
  observed?: RequestObservation;
}

/** The Worker's measurements of one answered request. */
export interface RequestObservation {
  /** ms from sending the first leg to D's first byte: P's answer (when P ran first) plus D's first byte */
  ttftMs?: number;
  /** a stream's data events and the ms between the first and the last */
  streamEvents?: number;
  streamSpanMs?: number;
}

export interface FailoverResponse {
  /** the node to try next, null when no other node may be tried */
  next: string | null;
}

export interface NodeStatus {
  id: string;
  url: string;
  roles: Role[];
  group: string | null;
  weight: number;
  drain: boolean;
  healthy: boolean;
  probeUp: boolean;
  breaker: BreakerState;
  ejectedUntil: number;
  /** until when the node asked to be left alone (a 503/429's retry-after; epoch ms), null when it did not or that time passed */
  busyUntil: number | null;
  failureStreak: number;
  failuresTotal: number;
  lastFailureAt: number;
  /** tokens: KV tokens of the decode streams open on it; prefillTokens: uncached tokens of its prefills running */
  inflight: { prefill: number; decode: number; tokens: number; prefillTokens: number };
  requestsTotal: { prefill: number; decode: number };
  /** whether the node's prefill answers carry prompt_tokens_details (observability/usage-details.ts) */
  usageDetails?: UsageDetailsVerdict;
  /** the engine's last /metrics reading (null until a poll answered) and its projection now (null when stale) */
  signals: NodeSignalsStatus | null;
  /**
   * cache-hit feedback: cached tokens the router predicted and the engine reported (summed), times
   * the node was taken to have lost its cache, and its learned characters per token
   */
  prefix: { predictedTokens: number; cachedTokens: number; cacheLost: number; charsPerToken: number };
  /** learned rates (SPEC 9): prefill at context 0, decode step of one sequence and ms each further one adds, KV transfer to it (absent in snapshots of older objects) */
  rates?: { prefillTokensPerS: number; decodeStepMs: number; decodeMsPerSeq: number; transferMsPerGB: number };
}

export interface NodeSignalsStatus {
  /** reported by the engine at its last poll */
  kvUsage: number | null;
  waiting: number | null;
  running: number | null;
  kvCapacityTokens: number | null;
  /** when that poll answered (epoch ms) and how old it is */
  at: number;
  ageMs: number;
  /** the projection routing uses now: null when the reading is older than signals.staleMs */
  projected: { kvUsage: number | null; queue: number | null } | null;
  busy: boolean;
}

export interface ClusterSnapshot {
  version: string | null;
  nodes: NodeStatus[];
  leases: number;
  /** leases that expired unreleased (their request stopped renewing without finishing) */
  expiredLeases: number;
  requests: Array<{ route: string; status: number; count: number }>;
  decisions: Array<{ role: Role; rule: string; count: number }>;
  /** how requests were served (disaggregated / local / colocated) and why */
  disagg: Array<{ mode: string; reason: string; count: number }>;
  prefix: { prefillEntries: number; decodeEntries: number; maxEntries: number; lookedUpBlocks: number; matchedBlocks: number };
  latency: { ttfb: Histogram; prefill: Histogram };
  /** requests waiting at the edge now, how long the admitted ones waited, and the ones refused by reason */
  admission: { queued: number; wait: Histogram; rejected: Array<{ reason: string; count: number }> };
  /** the last minutes of per-node figures (status page charts) */
  history: HistoryPoint[];
  /** actual / predicted TTFT under predicted disaggregation (buckets in the ratio's own unit) */
  prediction?: Histogram;
  /** routing precision per pool, last 15 minutes: follow-up turns judged and those that landed on their prefix */
  precision?: Array<{ pool: string; followUps: number; precise: number }>;
  now: number;
}

export interface Histogram {
  /** upper bounds in seconds, ascending; the +Inf bucket is implied by `count` */
  bounds: number[];
  /** cumulative-free counts per bound (not cumulative) */
  counts: number[];
  sum: number;
  count: number;
}

/** Requests counted under one API key label (a short hash of the key). */
export interface KeyCount {
  key: string;
  count: number;
}
