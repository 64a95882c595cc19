import type { ClusterView, Tier } from "../config/cluster-view";
import type { Decision, SelectionError } from "../routing/types";
import type { ClusterSnapshot, Histogram, KeyCount, NodeSignalsStatus, NodeStatus } from "../observability/cluster-snapshot";
import type { EngineUsage } from "./cache-feedback";

/** The document's view the object routes with: built by the config layer, so defined there. */
export type { ClusterView };
/** What the object shows operators: observability renders it, so defined there. */
export type { ClusterSnapshot, Histogram, KeyCount, NodeSignalsStatus, NodeStatus };

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
  /** the request's service tier (SPEC 9): its band in the edge queue; absent: default */
  tier?: Tier;
  /** whose fair share it counts against in the edge queue: its API key's label; absent: nobody's */
  flow?: string;
  /** a cell that is not the request's last resort (docs/scaling.md): answer decode_busy instead of waiting at the edge, so the Worker asks the next cell */
  spill?: boolean;
}

/** Why a request that waited at the edge was not admitted. */
export type AdmissionError =
  /** every decode node is busy: the queue is full, or the request waited `queueMs` */
  | { kind: "cluster_busy"; reason: "queue_full" | "timeout" | "shed"; retryAfterS: number }
  /** its API key holds more than its share of a full queue while other keys wait (429) */
  | { kind: "fair_share_exceeded"; retryAfterS: number }
  /** a `flex` request whose predicted TTFT exceeds admission.ttftSloMs, refused at once */
  | { kind: "slo_unmeetable"; predictedMs: number; retryAfterS: number }
  /** the request left the queue (its client left) */
  | { kind: "client_gone" };

export type RouteResponse =
  /** queuedMs: how long the request waited at the edge for a decode node that is not busy (absent: it did not) */
  | {
      ok: true;
      leaseId: string | null;
      decision: Decision;
      queuedMs?: number;
      wouldWait?: { queued: number };
      /** decided under this document version, not the request's (it waited through an edit) */
      version?: string;
    }
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
  /** the stream's output tokens, when a usage frame in it reported them */
  streamTokens?: number;
  /** a Responses stream: item and part events around its deltas, so its events say nothing of its node's tokens an event */
  streamEventsNotTokens?: boolean;
}

export interface FailoverResponse {
  /** the node to try next, null when no other node may be tried */
  next: string | null;
  /** a local prefill's D failed: the P the request now goes through (P then `next`) */
  prefill?: string;
}
