// Whether a prefill node reports `prompt_tokens_details`. The client's cached_tokens come from P
// (src/forward/stream.ts fixUsage), and vLLM writes them only when it runs with
// --enable-prompt-tokens-details *and* the count is non-zero (vllm serving_chat.py /
// serving_completion.py: `if self.enable_prompt_tokens_details and final_res.num_cached_tokens`).
// So answers without details prove nothing by themselves: a P with no prefix-cache hits (cold
// prompts, prefix caching off — the demo's first requests) writes none either way. The router
// names a P only once the engine has shown it had hits — its /metrics counter
// `vllm:prefix_cache_hits_total` grew between two polls — and then USAGE_DETAILS_AFTER_HITS more
// answers still came without details (the answers of the requests that hit have arrived by then),
// and none ever with. Said once in the log, and on the status page and /admin/status.

/** Answers without details, and none with, after which a P that has shown cache hits is reported as missing the flag. */
export const USAGE_DETAILS_SAMPLE = 20;
/** ... of which at least this many came after its /metrics showed prefix-cache hits. */
export const USAGE_DETAILS_AFTER_HITS = 5;

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
  /** answers counted when its /metrics first showed prefix-cache hits; null until then */
  hitsAt: number | null;
  /** its prefix-cache hits counter at the last poll */
  lastHits: number | null;
  warned: boolean;
}

export type UsageDetailsVerdict = "reported" | "missing" | "unknown";

export const freshUsageDetails = (): UsageDetailsRecord => ({ answers: 0, withDetails: 0, hitsAt: null, lastHits: null, warned: false });

export function usageDetailsVerdict(r: UsageDetailsRecord | undefined): UsageDetailsVerdict {
  if (!r) return "unknown";
  if (r.withDetails > 0) return "reported";
  const shownHits = r.hitsAt !== null && r.answers - r.hitsAt >= USAGE_DETAILS_AFTER_HITS;
  return shownHits && r.answers >= USAGE_DETAILS_SAMPLE ? "missing" : "unknown";
}

/** Counts one answer; true when this one made the node "missing" (log it): that happens once. */
export function noteUsageDetails(r: UsageDetailsRecord, reported: boolean): boolean {
  r.answers += 1;
  if (reported) r.withDetails += 1;
  if (r.warned || usageDetailsVerdict(r) !== "missing") return false;
  r.warned = true;
  return true;
}

/** A /metrics poll's prefix-cache hits counter: a rise since the last poll shows prefix caching on, and hitting. */
export function notePrefixHits(r: UsageDetailsRecord, hits: number): void {
  if (r.hitsAt === null && r.lastHits !== null && hits > r.lastHits) r.hitsAt = r.answers;
  r.lastHits = hits;
}

export function usageDetailsWarning(node: string): string {
  return `prefill node ${node} reported no prompt_tokens_details in ${USAGE_DETAILS_SAMPLE} answers although its /metrics shows prefix-cache hits: run it with --enable-prompt-tokens-details, or clients see cached_tokens 0`;
}

/** The warnings of a status snapshot's nodes, for the status page and /admin/status. */
export function usageDetailsWarnings(nodes: Array<{ id: string; usageDetails?: UsageDetailsVerdict | undefined }>): string[] {
  return nodes.filter((n) => n.usageDetails === "missing").map((n) => usageDetailsWarning(n.id));
}
