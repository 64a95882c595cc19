import type { Decision, Role } from "../routing/types";
import { newHistogram, observe } from "./histogram";
import type { ClusterSnapshot, LegReport } from "./types";

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

  countRequest(route: string, status: number): void {
    bump(this.#requests, `${route}\u0000${status}`);
  }

  countKey(label: string): void {
    bump(this.#keys, label);
  }

  /** A request was routed: each role's rule, and how it is served and why. */
  countRouted(decision: Decision): void {
    bump(this.#decisions, `prefill\u0000${decision.prefill.rule}`);
    bump(this.#decisions, `decode\u0000${decision.decode.rule}`);
    bump(this.#disagg, `${decision.mode}\u0000${decision.reason}`);
  }

  /** A lease expired unreleased: its request stopped renewing without finishing (counted as a 499). */
  countExpired(route: string): void {
    this.expiredLeases++;
    this.countRequest(route, 499);
  }

  /** A leg ended: an answered prefill's time until P answered, an answered decode's until D's first byte. */
  observeLeg(leg: Role, report: LegReport | undefined): void {
    if (report?.ms === undefined || report.outcome !== "ok") return;
    observe(leg === "prefill" ? this.latency.prefill : this.latency.ttfb, report.ms);
  }

  disagg(): ClusterSnapshot["disagg"] {
    return split(this.#disagg).map(({ parts, count }) => ({ mode: parts[0]!, reason: parts[1]!, count }));
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
