import type { Role } from "../routing/types";
import { newHistogram, observe } from "./histogram";
import type { ClusterSnapshot } from "./types";

/** The object's counters for /metrics: requests by route and status, keys, decisions, latencies, prefix lookups. */
export class RouterStats {
  readonly #requests = new Map<string, number>();
  /** requests per API key label (a short hash of the key, never the key) */
  readonly #keys = new Map<string, number>();
  readonly #decisions = new Map<string, number>();
  readonly latency = { ttfb: newHistogram(), prefill: newHistogram() };
  readonly prefix = { lookedUpBlocks: 0, matchedBlocks: 0 };
  expiredLeases = 0;

  countRequest(route: string, status: number): void {
    bump(this.#requests, `${route}\u0000${status}`);
  }

  countKey(label: string): void {
    bump(this.#keys, label);
  }

  countDecision(role: Role, rule: string): void {
    bump(this.#decisions, `${role}\u0000${rule}`);
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
