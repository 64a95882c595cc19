import { PREDICTION_RATIO_BOUNDS } from "../observability/cluster-snapshot";
import type { Decision, Role } from "../routing/types";
import { newHistogram, observe, observeValue } from "./histogram";

/** Buckets of actual / predicted TTFT: a quarter to four times, finer around 1. */
export { PREDICTION_RATIO_BOUNDS };
import type { ClusterSnapshot, LegReport } from "./types";

/**
 * The object's counters for /metrics: requests by route and status, keys, decisions, latencies,
 * prefix lookups. A counter's key is its labels as JSON, read back as a row with its count.
 */
export class RouterStats {
  readonly #requests = new Map<string, number>();
  /** requests per API key label (a short hash of the key, never the key) */
  readonly #keys = new Map<string, number>();
  readonly #decisions = new Map<string, number>();
  /** per-request decisions of how to serve (SPEC 8: mode and reason) */
  readonly #disagg = new Map<string, number>();
  readonly latency = { ttfb: newHistogram(), prefill: newHistogram() };
  /** actual / predicted TTFT of the requests predicted disaggregation routed */
  readonly predictionRatio = newHistogram(PREDICTION_RATIO_BOUNDS);
  readonly prefix = { lookedUpBlocks: 0, matchedBlocks: 0 };
  expiredLeases = 0;

  countRequest(route: string, status: number): void {
    bump(this.#requests, { route, status });
  }

  countKey(label: string): void {
    bump(this.#keys, { key: label });
  }

  /** A request was routed: each role's rule, and how it is served and why. */
  countRouted(decision: Decision): void {
    this.routed++;
    bump(this.#decisions, { role: "prefill", rule: decision.prefill.rule });
    bump(this.#decisions, { role: "decode", rule: decision.decode.rule });
    bump(this.#disagg, { mode: decision.mode, reason: decision.reason });
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

  /** A request predicted at `predictedMs` had its first token after `actualMs`. */
  observePrediction(actualMs: number, predictedMs: number): void {
    if (actualMs >= 0 && predictedMs > 0) observeValue(this.predictionRatio, actualMs / predictedMs);
  }

  /** Requests routed so far (the history's request rate). */
  routed = 0;

  disagg(): ClusterSnapshot["disagg"] {
    return rows(this.#disagg);
  }

  countPrefix(looked: number, matched: number): void {
    this.prefix.lookedUpBlocks += looked;
    this.prefix.matchedBlocks += matched;
  }

  keyCounts(): Array<{ key: string; count: number }> {
    return rows(this.#keys);
  }

  requests(): ClusterSnapshot["requests"] {
    return rows(this.#requests);
  }

  decisions(): ClusterSnapshot["decisions"] {
    return rows(this.#decisions);
  }
}

function bump(m: Map<string, number>, labels: object): void {
  const key = JSON.stringify(labels);
  m.set(key, (m.get(key) ?? 0) + 1);
}

/** The counters as rows: their labels and count (typed by the caller: the keys were written by this class). */
const rows = <T>(m: Map<string, number>): T[] => [...m].map(([labels, count]) => ({ ...JSON.parse(labels), count }));
