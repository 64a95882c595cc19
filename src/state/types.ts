import type { Decision, Role, SelectionError, SelectionPolicy } from "../routing/types";
import type { NodeReach } from "../config/schema";
import type { UsageDetailsVerdict } from "../observability/usage-details";
import type { BreakerState, HealthSettings } from "./health";

/** The part of the cluster document the Durable Object needs; sent with every call that routes. */
export interface ClusterView {
  version: string;
  protocol: "vllm" | "vllm-mooncake" | "sglang" | "colocated";
  policy: SelectionPolicy;
  health: HealthSettings;
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
  }>;
}

export interface RouteRequest {
  /** version of the document the Worker routes with; the view itself only when the object asks for it */
  version: string;
  cluster?: ClusterView | undefined;
  model: string;
  /** hex SHA-256 of the affinity key material, or null */
  key: string | null;
  /** chained prefix block hashes (cache_aware only; empty otherwise) */
  prefixHashes: string[];
  /** estimated prompt tokens, carried by the lease */
  tokens: number;
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

export type RouteResponse = { ok: true; leaseId: string | null; decision: Decision } | { ok: false; error: SelectionError | { kind: "stale_view" } };

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
  prefill?: LegReport;
  decode?: LegReport;
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
  failureStreak: number;
  failuresTotal: number;
  lastFailureAt: number;
  inflight: { prefill: number; decode: number; tokens: number };
  requestsTotal: { prefill: number; decode: number };
  /** whether the node's prefill answers carry prompt_tokens_details (observability/usage-details.ts) */
  usageDetails?: UsageDetailsVerdict;
}

export interface ClusterSnapshot {
  version: string | null;
  nodes: NodeStatus[];
  leases: number;
  /** leases that expired unreleased (their request stopped renewing without finishing) */
  expiredLeases: number;
  requests: Array<{ route: string; status: number; count: number }>;
  decisions: Array<{ role: Role; rule: string; count: number }>;
  prefix: { prefillEntries: number; decodeEntries: number; maxEntries: number; lookedUpBlocks: number; matchedBlocks: number };
  latency: { ttfb: Histogram; prefill: Histogram };
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
