import type { Role } from "../routing/types";
import { signalsOf } from "./cluster-settings";
import type { EdgeAdmission } from "./edge-admission";
import type { SignalSettings } from "../config/cluster-view";
import type { EngineSignals } from "./engine-signals";
import { breakerState, isHealthy } from "./health";
import type { NodeHealthTable } from "./health-table";
import { type LeaseTable, leaseKvTokens, newLoad } from "./leases";
import type { HistoryPoint, NodeHistory } from "./node-history";
import { type NodeRateTable, profileOf } from "./node-rates";
import type { RoutingPrecision } from "./routing-precision";
import { KV_BYTES_PER_TOKEN } from "../routing/predict";
import type { PrefillUsageDetails } from "./prefill-usage-details";
import type { PrefixMemory } from "./prefix-memory";
import type { RouterStats } from "./router-stats";
import type { SilentNodes } from "./silent-nodes";
import type { ClusterSnapshot, ClusterView, NodeStatus } from "./types";

/** The object's modules that the operators' view reads (one record, built once). */
export interface StatusSources {
  health: NodeHealthTable;
  leases: LeaseTable;
  signals: EngineSignals;
  prefixes: PrefixMemory;
  usageDetails: PrefillUsageDetails;
  stats: RouterStats;
  admission: EdgeAdmission;
  history: NodeHistory;
  silent: SilentNodes;
  rates: NodeRateTable;
  precision: RoutingPrecision;
}

type ViewNode = ClusterView["nodes"][number];

/** Shared state as operators see it (/metrics, the status page, /admin/status); `withHistory`: the status page's per-node history too. */
export function clusterSnapshot(cluster: ClusterView | null, m: StatusSources, now: number, withHistory: boolean): ClusterSnapshot {
  const signals = cluster ? signalsOf(cluster) : null;
  return {
    version: cluster?.version ?? null,
    nodes: (cluster?.nodes ?? []).map((n) => nodeStatus(n, signals!, now, m, cluster ?? undefined)),
    leases: m.leases.size,
    expiredLeases: m.stats.expiredLeases,
    requests: m.stats.requests(),
    decisions: m.stats.decisions(),
    disagg: m.stats.disagg(),
    prefix: { ...m.prefixes.sizes(), ...m.stats.prefix },
    latency: m.stats.latency,
    admission: m.admission.status(),
    history: withHistory ? m.history.points(now) : [],
    prediction: m.stats.predictionRatio,
    precision: cluster ? [{ pool: poolLabel(cluster), ...m.precision.counts(now) }] : [],
    now,
  };
}

/** One node: its health and breaker, its leases' load, its engine's signals, its prefix feedback. */
/** The pool an object serves, as /metrics labels it: `all` for a whole cluster, else its models (the view's version suffix). */
export const poolLabel = (cluster: ClusterView): string => {
  const at = cluster.version.indexOf("/pool:");
  return at < 0 ? "all" : cluster.version.slice(at + "/pool:".length);
};

export function nodeStatus(n: ViewNode, signals: SignalSettings, now: number, m: StatusSources, cluster?: ClusterView): NodeStatus {
  const h = m.health.view(n.id);
  const load = m.leases.loadOf(n.id);
  const { requestsPrefill, requestsDecode, prefill, decode, tokens, prefillTokens } = load ?? newLoad();
  const inflight = { prefill, decode, tokens, prefillTokens };
  const decodes = n.role === "decode" || n.role === "both";
  return {
    id: n.id,
    url: n.url,
    roles: n.role === "both" ? (["prefill", "decode"] as Role[]) : [n.role],
    group: n.group ?? null,
    weight: n.weight,
    drain: n.drain,
    healthy: isHealthy(h, now),
    probeUp: h.probeUp,
    breaker: breakerState(h, now),
    ejectedUntil: h.ejectedUntil,
    busyUntil: h.busyUntil > now ? h.busyUntil : null,
    failureStreak: h.failureStreak,
    failuresTotal: h.failuresTotal,
    usageAnomalies: h.usageAnomalies,
    lastFailureAt: h.lastFailureAt,
    inflight,
    requestsTotal: { prefill: requestsPrefill, decode: requestsDecode },
    signals: m.signals.status(n.id, decodes, now, signals, leaseKvTokens(load)),
    usageDetails: m.usageDetails.verdict(n.id),
    noSignals: m.silent.silent(n.id),
    prefix: m.prefixes.status(n.id),
    rates: ratesStatus(m.rates.view(n.id, profileOf(cluster?.profile, n.profile), now), m.rates.tokensPerEvent(n.id, now)),
  };
}

const ratesStatus = (r: ReturnType<NodeRateTable["view"]>, tokensPerEvent: number): NonNullable<NodeStatus["rates"]> => ({
  prefillTokensPerS: Math.round(1000 / r.prefillMsPerToken),
  decodeStepMs: Math.round(r.decodeStepMs * 10) / 10,
  decodeMsPerSeq: Math.round(r.decodeMsPerSeq * 100) / 100,
  transferMsPerGB: Math.round((r.transferMsPerToken * 1e9) / KV_BYTES_PER_TOKEN),
  tokensPerEvent: Math.round(tokensPerEvent * 10) / 10,
  decodeTokens: Math.round(r.decodeTokens ?? 0),
});

/** One point of per-node figures for the status page's history: in-flight requests, reported KV use and queue, requests routed so far. */
export function historyPoint(cluster: ClusterView, now: number, m: Pick<StatusSources, "leases" | "signals" | "stats">): HistoryPoint {
  const staleMs = signalsOf(cluster).staleMs;
  return {
    t: now,
    routed: m.stats.routed,
    nodes: cluster.nodes.map((n) => {
      const load = m.leases.loadOf(n.id);
      const view = m.signals.view(n.id, now, staleMs);
      return {
        node: n.id,
        inflight: (load?.prefill ?? 0) + (load?.decode ?? 0),
        kvUsage: view?.reported.kvUsage ?? null,
        queue: view?.reported.waiting ?? null,
        requests: (load?.requestsPrefill ?? 0) + (load?.requestsDecode ?? 0),
      };
    }),
  };
}
