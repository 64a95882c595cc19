// What the Durable Object shows operators: the snapshot /metrics, /status and /admin/status
// render (state/snapshot.ts builds it). Defined here, below the object, so observability reads it
// without importing state.
import type { Role } from "../routing/types";
import type { UsageDetailsVerdict } from "./usage-details";

/** A node's circuit breaker (state/health.ts). */
export type BreakerState = "closed" | "open" | "half_open";

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
  usageAnomalies: number;
  lastFailureAt: number;
  /** tokens: KV tokens of the decode streams open on it; prefillTokens: uncached tokens of its prefills running */
  inflight: { prefill: number; decode: number; tokens: number; prefillTokens: number };
  requestsTotal: { prefill: number; decode: number };
  /** whether the node's prefill answers carry prompt_tokens_details (observability/usage-details.ts) */
  usageDetails?: UsageDetailsVerdict;
  /** the engine's last /metrics reading (null until a poll answered) and its projection now (null when stale) */
  signals: NodeSignalsStatus | null;
  /** answers its probes but its /metrics never gave a reading (state/silent-nodes.ts) */
  noSignals?: boolean;
  /** learned rates (SPEC 9): prefill at context 0, decode step of one sequence and ms each further one adds, KV transfer to it (absent in snapshots of older objects) */
  /** learned rates; tokensPerEvent: the tokens an event of its streams carries (an engine's --stream-interval); decodeTokens: the cluster's mean tokens a request decodes */
  rates?: { prefillTokensPerS: number; decodeStepMs: number; decodeMsPerSeq: number; transferMsPerGB: number; tokensPerEvent: number; decodeTokens: number };
  /**
   * cache-hit feedback: cached tokens the router predicted and the engine reported (summed), times
   * the node was taken to have lost its cache, and its learned characters per token
   */
  prefix: { predictedTokens: number; cachedTokens: number; cacheLost: number; charsPerToken: number };
  /** the cell (its object's name) the node is in (docs/scaling.md); absent without cells */
  cell?: string | null;
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
  /** requests waiting at the edge now (in all and per tier), how long the admitted ones waited, and the ones refused by reason and tier */
  admission: {
    queued: number;
    /** absent in a snapshot from an object that predates tiers */
    queuedByTier?: Array<{ tier: string; count: number }>;
    wait: Histogram;
    rejected: Array<{ reason: string; tier?: string; count: number }>;
  };
  /** the last minutes of per-node figures (status page charts) */
  history: HistoryPoint[];
  /** actual / predicted TTFT under predicted disaggregation (buckets in the ratio's own unit) */
  prediction?: Histogram;
  /** routing precision per pool, last 15 minutes: follow-up turns judged and those that landed on their prefix */
  precision?: Array<{ pool: string; followUps: number; precise: number }>;
  /** sharded polling (docs/scaling.md): each poller object, its nodes, and how long since it last pushed readings (or was assigned); absent while the pool's object polls */
  pollers?: Array<{ poller: number; nodes: number; silentMs: number; pool?: string }>;
  /** cells (docs/scaling.md): each cell's object, its nodes, the leases it holds and the requests waiting in it; absent without cells */
  cells?: Array<{ cell: string; nodes: string[]; leases: number; queued: number }>;
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

/** One sample of a node's figures, for the status page's charts. */
export interface NodeSample {
  node: string;
  inflight: number;
  /** the engine's reported KV use 0..1, null without a fresh poll */
  kvUsage: number | null;
  queue: number | null;
  /** requests routed to the node so far, both roles (rates come from the difference of two points) */
  requests?: number;
}

export interface HistoryPoint {
  t: number;
  nodes: NodeSample[];
  /** requests routed so far by this object */
  routed?: number;
}

/** Every reason a request is refused at the edge (the metric's `reason` label; state/edge-admission.ts refuses them). */
export const ADMISSION_REFUSALS = ["queue_full", "timeout", "shed", "fair_share_exceeded", "slo_unmeetable"] as const;

/**
 * Buckets of actual / predicted TTFT (the ratio's own unit; state/router-stats.ts counts them).
 * 0.75 and 1.25 bound issue 23's accuracy goal: median |actual / predicted - 1| <= 0.25 holds
 * exactly when half the ratios fall in (0.75, 1.25].
 */
export const PREDICTION_RATIO_BOUNDS = [0.25, 0.5, 0.67, 0.75, 0.8, 0.9, 1, 1.1, 1.25, 1.5, 2, 4];

/** A histogram with nothing counted yet. */
export const emptyHistogram = (bounds: number[]): Histogram => ({ bounds, counts: bounds.map(() => 0), sum: 0, count: 0 });
