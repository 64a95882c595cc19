import { usageDetailsWarnings, type UsageDetailsVerdict } from "./usage-details";

/** Polls without a reading after which a node that answers its probes is named (src/state/silent-nodes.ts). */
export const SILENT_AFTER_POLLS = 3;

export function silentNodeWarning(node: string): string {
  return `node ${node} answers its probes but its /metrics gave no reading in ${SILENT_AFTER_POLLS} polls: an SGLang server needs --enable-metrics (off by default), else the router cannot see its KV use or queue`;
}

/** The warnings about nodes that operators can act on, for the status page and /admin/status. */
export function nodeWarnings(nodes: Array<{ id: string; usageDetails?: UsageDetailsVerdict | undefined; noSignals?: boolean | undefined }>): string[] {
  return [...usageDetailsWarnings(nodes), ...nodes.filter((n) => n.noSignals).map((n) => silentNodeWarning(n.id))];
}
