// Whether a prefill node reports `prompt_tokens_details`. The client's cached_tokens come from P
// (src/forward/stream.ts fixUsage), and vLLM writes them only when it runs with
// --enable-prompt-tokens-details *and* the count is non-zero (vllm serving_chat.py /
// serving_completion.py: `if self.enable_prompt_tokens_details and final_res.num_cached_tokens`).
// One answer without details proves nothing (a cold prompt has 0 cached tokens); a P that
// answered many requests and never once reported them almost surely runs without the flag —
// with prefix caching on, a chat template's opening tokens are already a cache hit on the second
// request. The router says so once in the log, and on the status page and /admin/status.

/** Answers without details, and none with, after which a P is reported as missing the flag. */
export const USAGE_DETAILS_SAMPLE = 20;

/** What P's answer says: true with `prompt_tokens_details`, false without, null when it has no chat/completions usage to judge. */
export function usageDetailsOf(answer: Record<string, unknown>): boolean | null {
  const usage = answer.usage as Record<string, unknown> | null | undefined;
  if (!usage || typeof usage !== "object" || typeof usage.prompt_tokens !== "number") return null;
  return usage.prompt_tokens_details != null;
}

/** One node's record (kept by the ClusterState object). */
export interface UsageDetailsRecord {
  answers: number;
  withDetails: number;
}

export type UsageDetailsVerdict = "reported" | "missing" | "unknown";

export const freshUsageDetails = (): UsageDetailsRecord => ({ answers: 0, withDetails: 0 });

export function usageDetailsVerdict(r: UsageDetailsRecord | undefined): UsageDetailsVerdict {
  if (!r) return "unknown";
  if (r.withDetails > 0) return "reported";
  return r.answers >= USAGE_DETAILS_SAMPLE ? "missing" : "unknown";
}

/**
 * Counts one answer; true when this one made the node "missing" (log it): answers count up one
 * at a time, so that is the sample's last answer with none reported before, and it happens once.
 */
export function noteUsageDetails(r: UsageDetailsRecord, reported: boolean): boolean {
  r.answers += 1;
  if (reported) r.withDetails += 1;
  return r.withDetails === 0 && r.answers === USAGE_DETAILS_SAMPLE;
}

export function usageDetailsWarning(node: string): string {
  return `prefill node ${node} reported no prompt_tokens_details in ${USAGE_DETAILS_SAMPLE} answers: run it with --enable-prompt-tokens-details, or clients see cached_tokens 0`;
}

/** The warnings of a status snapshot's nodes, for the status page and /admin/status. */
export function usageDetailsWarnings(nodes: Array<{ id: string; usageDetails?: UsageDetailsVerdict | undefined }>): string[] {
  return nodes.filter((n) => n.usageDetails === "missing").map((n) => usageDetailsWarning(n.id));
}
