import type { Role } from "../routing/types";
import { newHistogram, observe } from "./histogram";
import type { ClusterSnapshot } from "./types";

/** Seconds a request may wait at the edge: 10 ms to 10 minutes (admission.queueMs at most). */
const ADMISSION_WAIT_BOUNDS = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600];

/** The object's counters for /metrics: requests by route and status, keys, decisions, latencies, prefix lookups. */
export class RouterStats {
  readonly #requests = new Map<string, number>();
  /** requests per API key label (a short hash of the key, never the key) */
  readonly #keys = new Map<string, number>();
  readonly #decisions = new Map<string, number>();
  /** per-request decisions of how to serve (SPEC 8: mode and reason) */
  readonly #disagg = new Map<string, number>();
  readonly latency = { ttfb: newHistogram(), prefill: newHistogram() };
  readonly prefix = { lookedUpBlocks: 0, matchedBlocks: 0 };
  expiredLeases = 0;
  /** how long admitted requests waited at the edge, and requests refused there by reason */
  readonly admissionWait = newHistogram(ADMISSION_WAIT_BOUNDS);
  readonly #rejected = new Map<string, number>();

  countRequest(route: string, status: number): void {
    bump(this.#requests, `${route}\u0000${status}`);
  }

  countKey(label: string): void {
    bump(this.#keys, label);
  }

  countDecision(role: Role, rule: string): void {
    bump(this.#decisions, `${role}\u0000${rule}`);
  }

  countDisagg(mode: string, reason: string): void {
    bump(this.#disagg, `${mode}\u0000${reason}`);
  }

  disagg(): ClusterSnapshot["disagg"] {
    return split(this.#disagg).map(({ parts, count }) => ({ mode: parts[0]!, reason: parts[1]!, count }));
  }

  observeTtfb(ms: number): void {
    observe(this.latency.ttfb, ms);
  }

  observePrefill(ms: number): void {
    observe(this.latency.prefill, ms);
  }

  countPrefix(looked: number, matched: number): void {
    this.prefix.lookedUpBlocks += looked;
    this.prefix.matchedBlocks += matched;
  }

  observeAdmissionWait(ms: number): void {
    observe(this.admissionWait, ms);
  }

  countRejected(reason: string): void {
    bump(this.#rejected, reason);
  }

  rejected(): Array<{ reason: string; count: number }> {
    return [...this.#rejected].map(([reason, count]) => ({ reason, count }));
  }

  keyCounts(): Array<{ key: string; count: number }> {
    return [...this.#keys].map(([key, count]) => ({ key, count }));
  }

  requests(): ClusterSnapshot["requests"] {
    return split(this.#requests).map(({ parts, count }) => ({ route: parts[0]!, status: Number(parts[1]), count }));
  }

  decisions(): ClusterSnapshot["decisions"] {
    return split(this.#decisions).map(({ parts, count }) => ({ role: parts[0] as Role, rule: parts[1]!, count }));
  }
}

function bump(m: Map<string, number>, key: string): void {
  m.set(key, (m.get(key) ?? 0) + 1);
}

const split = (m: Map<string, number>) => [...m].map(([k, count]) => ({ parts: k.split("\u0000"), count }));
