// Conditional disaggregation's one question, pure (SPEC 8): does the decode node picked for a
// request prefill it alone, or does a P prefill it and hand D the KV?
//
// - Cached on D: llm-d picks the decode endpoint first and runs no prefill when the prompt's
//   tokens not cached there are below `nonCachedTokens` (llm-d/llm-d-inference-scheduler
//   pkg/plugins/profile/prefix_based_pd_decider.go); Dynamo bypasses remote prefill when the
//   uncached tokens on the chosen decode worker are below a threshold (2048) and below a share
//   of the prompt (0.7) (ai-dynamo/dynamo lib/kv-router/src/conditional_disagg.rs,
//   IslBoundingPolicy). Both thresholds are SPEC 8's `localPrefillTokens` / `localPrefillRatio`.
// - The P it would get is busy: Dynamo's PrefillLoadPolicy bypasses when the chosen prefill
//   worker would queue the request anyway, and its isl_or_load policy takes either reason.
// - Either bypass is vetoed when the decode node is busy (Dynamo's decode-busy gate, AND-ed over
//   the policy's verdict, with the request's own tokens projected onto the decode node).
// - A node that cannot prefill as a decode node (SGLang decode mode) never does.
import type { PdReason } from "./types";

export interface LocalPrefillThresholds {
  /** `policy.localPrefillTokens`: prefill alone only below this many uncached tokens */
  tokens: number;
  /** `policy.localPrefillRatio`: and below this share of the prompt */
  ratio: number;
}

export interface LocalPrefillQuestion {
  /** the prompt's tokens on D; 0 when its size is unknown (then never local: nothing says it is small) */
  promptTokens: number;
  /** the prompt's tokens D is predicted not to hold */
  uncachedTokens: number;
  thresholds: LocalPrefillThresholds;
  /** D may prefill alone (node `localPrefill`) */
  localPrefill: boolean;
  /** D is busy, or would be with this request's tokens (decode KV guard) */
  decodeBusy: boolean;
  /** the P this request would get has a queue at `queueBusy`; null when no P was looked at */
  prefillBusy: boolean | null;
}

export type LocalPrefillAnswer = { local: true; reason: "cached" | "prefill_busy" } | { local: false; reason: Extract<PdReason, "cold" | "decode_busy" | "no_local_prefill"> };

/** The uncached part is small in tokens and as a share of the prompt (both strictly below). */
export function cachedEnough(q: Pick<LocalPrefillQuestion, "promptTokens" | "uncachedTokens" | "thresholds">): boolean {
  if (!(q.promptTokens > 0)) return false;
  const uncached = Math.max(0, Math.min(q.uncachedTokens, q.promptTokens));
  return uncached < q.thresholds.tokens && uncached / q.promptTokens < q.thresholds.ratio;
}

export function decideLocalPrefill(q: LocalPrefillQuestion): LocalPrefillAnswer {
  if (!q.localPrefill) return { local: false, reason: "no_local_prefill" };
  const wants = cachedEnough(q) ? "cached" : q.prefillBusy === true ? "prefill_busy" : null;
  if (wants === null) return { local: false, reason: "cold" };
  if (q.decodeBusy) return { local: false, reason: "decode_busy" };
  return { local: true, reason: wants };
}

/** Every (mode, reason) a decision can carry: `pd_router_disagg_decisions_total` starts each at 0. */
export const DISAGG_DECISIONS: ReadonlyArray<{ mode: "disaggregated" | "local" | "colocated"; reason: PdReason }> = [
  { mode: "disaggregated", reason: "always" },
  { mode: "disaggregated", reason: "cold" },
  { mode: "disaggregated", reason: "decode_busy" },
  { mode: "disaggregated", reason: "no_local_prefill" },
  { mode: "local", reason: "cached" },
  { mode: "local", reason: "prefill_busy" },
  { mode: "local", reason: "pinned" },
  { mode: "disaggregated", reason: "predicted" },
  { mode: "local", reason: "predicted" },
  { mode: "colocated", reason: "always" },
];
