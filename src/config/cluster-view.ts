// The cluster document as the Durable Object receives it: the Worker's config layer builds the
// view (config/runtime.ts), the object keeps it and routes with it. Defined here, below both, so
// the object's modules and the config loader share one type without config importing state.
import type { RateProfile } from "../routing/predict";
import type { SelectionPolicy } from "../routing/types";
import type { NodeReach } from "./schema";

/** health.* of the cluster document: active probes and passive ejection (state/health.ts) */
export interface HealthSettings {
  intervalMs: number;
  /** absent: the protocol's default (probeSettings) */
  probeTimeoutMs?: number | undefined;
  /** absent: the protocol's default (probeSettings) */
  probePath?: string | undefined;
  downAfter: number;
  upAfter: number;
  ejectAfter: number;
  ejectBaseMs: number;
  ejectMaxMs: number;
}

/** signals.* of the cluster document (SPEC 8) */
export interface SignalSettings {
  intervalMs: number;
  staleMs: number;
  kvBusy: number;
  queueBusy: number;
  /** more nodes than this: /metrics polls go to poller objects (absent in views saved before: the default) */
  shardAbove?: number | undefined;
  /** the nodes one poller object polls */
  nodesPerPoller?: number | undefined;
}

/** admission.* of the cluster document (SPEC 8, 9) */
export interface AdmissionSettings {
  queueMs: number;
  maxQueued: number;
  /** a `flex` request whose predicted TTFT exceeds this is refused at once (503 slo_unmeetable); null: no objective */
  ttftSloMs?: number | null | undefined;
  /** `apiKey`: waiters of a tier are served round-robin across API keys; `none`: in deadline order */
  fairShare?: "apiKey" | "none" | undefined;
  /** share of a decode node's KV kept for `priority` requests: the guard judges the others at kvBusy less it */
  priorityReserve?: number | undefined;
}

/** Service tiers (SPEC 9), highest first: OpenAI's `service_tier`, with `auto` read as `default`. */
export const TIERS = ["priority", "default", "flex"] as const;
export type Tier = (typeof TIERS)[number];

/** The part of the cluster document the Durable Object needs; sent with every call that routes. */
export interface ClusterView {
  version: string;
  /**
   * When the sending isolate first read this version from KV (ms since the epoch): the object
   * never lets a view read earlier replace one read later (an isolate still on the old document
   * must not flip the object back). Absent in views saved before it: oldest.
   */
  readAt?: number | undefined;
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
    /** how the node is reached and its token's secret name, for the probes (src/config/node-access.ts); absent in views stored before them */
    reach?: NodeReach | undefined;
    apiKeySecret?: string | undefined;
    /** may prefill a request alone as a decode node (conditional disaggregation; SPEC 8) */
    localPrefill?: boolean | undefined;
    /** this node's own prior rates, over the pool's */
    profile?: Partial<RateProfile> | undefined;
  }>;
}
