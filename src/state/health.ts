// Passive (circuit breaker) and active (probe) health of one node, as pure transitions.
// The Durable Object keeps one NodeHealth per node and applies these with its clock.
import type { HealthSettings } from "../config/cluster-view";
import type { BreakerState } from "../observability/cluster-snapshot";

export interface ProbeSettings {
  path: string;
  timeoutMs: number;
}

/**
 * Probe defaults per protocol. SGLang's `/health` (and `/health_generate`) runs a one-token
 * generation and polls for it in 1 s sleeps, so it never answers in under a second and takes
 * longer on a busy node; its `/v1/models` only reads the tokenizer manager's fields (no scheduler
 * round trip). See sgl-project/sglang python/sglang/srt/entrypoints/http_server.py
 * (`health_generate`: `await asyncio.sleep(1)` before the first check; `available_models`).
 * A wedged scheduler behind a live HTTP process is caught by passive ejection instead.
 */
const PROBE_DEFAULTS: Record<string, ProbeSettings> = {
  sglang: { path: "/v1/models", timeoutMs: 5_000 },
};
const PROBE_DEFAULT: ProbeSettings = { path: "/health", timeoutMs: 2_000 };

/**
 * The probe a node of this cluster gets: the document's `health.probePath` / `probeTimeoutMs`,
 * else the protocol's defaults. A defaulted timeout never reaches the interval (probes would overlap).
 */
export function probeSettings(cluster: { protocol: string; health: HealthSettings }): ProbeSettings {
  const defaults = PROBE_DEFAULTS[cluster.protocol] ?? PROBE_DEFAULT;
  const h = cluster.health;
  return {
    path: h.probePath ?? defaults.path,
    timeoutMs: h.probeTimeoutMs ?? Math.max(1, Math.min(defaults.timeoutMs, Math.floor(h.intervalMs / 2))),
  };
}

export interface NodeHealth {
  /** active probes: false once `downAfter` probes in a row failed, true again after `upAfter` good ones */
  probeUp: boolean;
  probeFailStreak: number;
  probeOkStreak: number;
  /** passive: consecutive request failures since the last success */
  failureStreak: number;
  /** how many times in a row the node was ejected (drives the exponential backoff) */
  ejections: number;
  /** ejected until this epoch ms; 0 when not ejected */
  ejectedUntil: number;
  /** answered 503/429 (full, not broken): left alone until this epoch ms; 0 when never */
  busyUntil: number;
  /** a half-open trial request is out: nobody else may pick the node until it reports */
  trialInFlight: boolean;
  lastFailureAt: number;
  failuresTotal: number;
  /** answers whose usage was impossible (cached tokens negative or above the prompt): clamped for the client, counted here */
  usageAnomalies: number;
}

export const freshHealth = (): NodeHealth => ({
  probeUp: true,
  probeFailStreak: 0,
  probeOkStreak: 0,
  failureStreak: 0,
  ejections: 0,
  ejectedUntil: 0,
  busyUntil: 0,
  trialInFlight: false,
  lastFailureAt: 0,
  failuresTotal: 0,
  usageAnomalies: 0,
});

export function breakerState(h: NodeHealth, now: number): BreakerState {
  if (h.ejectedUntil === 0) return "closed";
  return now < h.ejectedUntil ? "open" : "half_open";
}

/** May the node take new work now? Probes up, and breaker closed or a half-open trial free. */
export function isHealthy(h: NodeHealth, now: number): boolean {
  if (!h.probeUp) return false;
  const state = breakerState(h, now);
  return state === "closed" || (state === "half_open" && !h.trialInFlight);
}

/** A request was routed to the node: in half-open, it becomes the one trial. */
export function onPicked(h: NodeHealth, now: number): void {
  if (breakerState(h, now) === "half_open") h.trialInFlight = true;
}

export function onSuccess(h: NodeHealth): void {
  h.failureStreak = 0;
  h.ejections = 0;
  h.ejectedUntil = 0;
  h.trialInFlight = false;
}

export function ejectionMs(ejections: number, s: HealthSettings): number {
  return Math.min(s.ejectMaxMs, s.ejectBaseMs * 2 ** Math.max(0, ejections - 1));
}

/** A request to the node failed through the node's fault (connect, timeout, 5xx). */
export function onFailure(h: NodeHealth, now: number, s: HealthSettings): void {
  h.failureStreak += 1;
  h.failuresTotal += 1;
  h.lastFailureAt = now;
  const trialFailed = h.trialInFlight || breakerState(h, now) === "half_open";
  h.trialInFlight = false;
  if (trialFailed || h.failureStreak >= s.ejectAfter) {
    h.ejections += 1;
    h.ejectedUntil = now + ejectionMs(h.ejections, s);
  }
}

/** A request ended without telling anything about the node (client abort): free a held trial. */
export function onInconclusive(h: NodeHealth): void {
  h.trialInFlight = false;
}

export function onProbe(h: NodeHealth, ok: boolean, now: number, s: HealthSettings): void {
  if (ok) {
    h.probeFailStreak = 0;
    h.probeOkStreak += 1;
    if (!h.probeUp && h.probeOkStreak >= s.upAfter) h.probeUp = true;
  } else {
    h.probeOkStreak = 0;
    h.probeFailStreak += 1;
    if (h.probeUp && h.probeFailStreak >= s.downAfter) {
      h.probeUp = false;
      h.lastFailureAt = now;
    }
  }
}
