import type { AdmissionSettings, SignalSettings } from "../config/cluster-view";
import type { AlarmJob } from "./alarm-schedule";
import type { ClusterView } from "./types";

// The cluster view's settings as the object reads them, with the SPEC 8 defaults for a view saved
// before the document had these blocks.

const DEFAULT_SIGNALS: SignalSettings = { intervalMs: 5_000, staleMs: 15_000, kvBusy: 0.9, queueBusy: 8 };
const DEFAULT_ADMISSION: AdmissionSettings = { queueMs: 30_000, maxQueued: 1_000, ttftSloMs: null, fairShare: "apiKey" };

export const signalsOf = (c: ClusterView): SignalSettings => c.signals ?? DEFAULT_SIGNALS;
export const admissionOf = (c: ClusterView): AdmissionSettings => c.admission ?? DEFAULT_ADMISSION;
/** the alarm's two jobs: probes every `health.intervalMs`, /metrics polls every `signals.intervalMs` */
export const periodsOf = (c: ClusterView): Record<AlarmJob, number> => ({ probe: c.health.intervalMs, poll: signalsOf(c).intervalMs });
/** `retry-after` of a 503 cluster_busy: the next poll may show room */
export const retryAfterSOf = (c: ClusterView | null): number => (c ? Math.max(1, Math.ceil(signalsOf(c).intervalMs / 1000)) : 1);
/** a /metrics poll's whole read: half the period, at most 2 s */
export const pollTimeoutMsOf = (c: ClusterView): number => Math.max(1, Math.min(2_000, Math.floor(signalsOf(c).intervalMs / 2)));
