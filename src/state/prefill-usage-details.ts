import {
  freshUsageDetails,
  notePrefixHits,
  noteUsageDetails,
  usageDetailsVerdict,
  usageDetailsWarning,
  type UsageDetailsRecord,
  type UsageDetailsVerdict,
} from "../observability/usage-details";

/** Per prefill node: do its answers carry prompt_tokens_details (observability/usage-details.ts says why it matters). */
export class PrefillUsageDetails {
  readonly #byNode = new Map<string, UsageDetailsRecord>();

  /** One answer of the node, with details or without; the first time it looks like a missing flag, the log says so once. */
  note(node: string, reported: boolean): void {
    const record = this.#byNode.get(node) ?? freshUsageDetails();
    this.#byNode.set(node, record);
    if (noteUsageDetails(record, reported)) console.warn(JSON.stringify({ event: "prefill_usage_details_missing", node, message: usageDetailsWarning(node) }));
  }

  /** A /metrics poll of the node read its prefix-cache hits counter. */
  prefixHits(node: string, hits: number): void {
    const record = this.#byNode.get(node) ?? freshUsageDetails();
    this.#byNode.set(node, record);
    notePrefixHits(record, hits);
  }

  verdict(node: string): UsageDetailsVerdict {
    return usageDetailsVerdict(this.#byNode.get(node));
  }
}
