import { pollerCount, slicesFor } from "../config/plan";
import type { AdmissionSettings, SignalSettings } from "../config/cluster-view";
import type { AlarmJob } from "./alarm-schedule";
import type { ClusterView } from "./types";

// The cluster view's settings as the object reads them, with the SPEC 8 defaults for a view saved
// before the document had these blocks.

const DEFAULT_SIGNALS: SignalSettings = { intervalMs: 5_000, staleMs: 15_000, kvBusy: 0.9, queueBusy: 8 };
const DEFAULT_ADMISSION: AdmissionSettings = { queueMs: 30_000, maxQueued: 1_000, ttftSloMs: null, fairShare: "apiKey" };

export const signalsOf = (c: ClusterView): SignalSettings => c.signals ?? DEFAULT_SIGNALS;
export const admissionOf = (c: ClusterView): AdmissionSettings => c.admission ?? DEFAULT_ADMISSION;
/** the alarm's two jobs, each over every node once a period: probes every `health.intervalMs`, /metrics polls every `signals.intervalMs` */
const fullPeriodsOf = (c: ClusterView): Record<AlarmJob, number> => ({ probe: c.health.intervalMs, poll: signalsOf(c).intervalMs });
/** into how many slices of the nodes each job is spread over its period (src/config/plan.ts `slicesFor`) */
export function slicesOf(c: ClusterView): Record<AlarmJob, number> {
  const full = fullPeriodsOf(c);
  // sharded: pollers poll, and the poll job only watches them, once a period
  const poll = pollerCount(c.nodes.length, signalsOf(c)) > 0 ? 1 : slicesFor(c.nodes.length, full.poll);
  return { probe: slicesFor(c.nodes.length, full.probe), poll };
}
/** each job's sub-tick: its period over its slices (a slice of the nodes a sub-tick) */
export function periodsOf(c: ClusterView): Record<AlarmJob, number> {
  const full = fullPeriodsOf(c);
  const slices = slicesOf(c);
  return { probe: Math.floor(full.probe / slices.probe), poll: Math.floor(full.poll / slices.poll) };
}
/** `retry-after` of a 503 cluster_busy: the next poll may show room */
export const retryAfterSOf = (c: ClusterView | null): number => (c ? Math.max(1, Math.ceil(signalsOf(c).intervalMs / 1000)) : 1);
/** a /metrics poll's whole read: half the period, at most 2 s */
export const pollTimeoutMsOf = (c: ClusterView): number => Math.max(1, Math.min(2_000, Math.floor(signalsOf(c).intervalMs / 2)));
