import type { HealthSettings } from "../config/cluster-view";
import { freshHealth, isHealthy, onFailure, onInconclusive, onPicked, onProbe, onSuccess, type NodeHealth } from "./health";
import type { LegReport } from "./types";

/** How long a busy node asked to be left alone when it gave no retry-after, and the most we honour. */
export const BUSY_RETRY_DEFAULT_MS = 1_000;
export const BUSY_RETRY_MAX_MS = 300_000;

/** Each node's health record (transitions in health.ts), kept in step with the document's nodes. */
export class NodeHealthTable {
  readonly #byNode = new Map<string, NodeHealth>();

  get(node: string): NodeHealth | undefined {
    return this.#byNode.get(node);
  }

  /** The node's record, or a fresh one for a node not seen yet (not stored). */
  view(node: string): NodeHealth {
    return this.#byNode.get(node) ?? freshHealth();
  }

  /** A listed node that may take new work now (failover: an unknown node is never a fallback). */
  mayTake(node: string, now: number): boolean {
    const h = this.#byNode.get(node);
    return h !== undefined && isHealthy(h, now);
  }

  /** A request was routed to the node: in half-open, it is the one trial. */
  picked(node: string, now: number): void {
    const h = this.#byNode.get(node);
    if (h) onPicked(h, now);
  }

  /** A leg on the node ended: a success or a client error closes its breaker, a failure counts, busy opens its window, anything else frees a trial. */
  report(report: LegReport, now: number, s: HealthSettings | undefined): void {
    const h = this.#byNode.get(report.node);
    if (!h || !s) return;
    if (report.outcome === "ok" || report.outcome === "client_error") {
      onSuccess(h);
      // it answered: whatever window its last 429/503 asked for is over (issue 25 item 7)
      h.busyUntil = 0;
    } else if (report.outcome === "failure") onFailure(h, now, s);
    else {
      onInconclusive(h);
      if (report.outcome === "busy") h.busyUntil = now + Math.min(BUSY_RETRY_MAX_MS, report.retryAfterMs ?? BUSY_RETRY_DEFAULT_MS);
    }
  }

  /** When the earliest busy window still open ends (Infinity: none): a request waiting for it may go then. */
  busyEnd(now: number): number {
    let at = Infinity;
    for (const h of this.#byNode.values()) if (h.busyUntil > now && h.busyUntil < at) at = h.busyUntil;
    return at;
  }

  /** A probe of the node answered (`ok`) or not; true when it brought the node back up after its probes failed. */
  probed(node: string, ok: boolean, now: number, s: HealthSettings): boolean {
    const h = this.#byNode.get(node);
    if (!h) return false;
    const wasUp = h.probeUp;
    onProbe(h, ok, now, s);
    return !wasUp && h.probeUp;
  }

  /** Adds records for new nodes and drops those of nodes no longer listed; returns the dropped ids. */
  sync(ids: ReadonlySet<string>): string[] {
    for (const id of ids) if (!this.#byNode.has(id)) this.#byNode.set(id, freshHealth());
    const gone = [...this.#byNode.keys()].filter((id) => !ids.has(id));
    for (const id of gone) this.#byNode.delete(id);
    return gone;
  }

  clear(): void {
    this.#byNode.clear();
  }
}
