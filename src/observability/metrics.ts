import type { Context } from "hono";
import type { ConfigSnapshot } from "../config/load";
import { routingUnits } from "../config/cells";
import type { NodePool } from "../config/pools";
import { clusterState, clusterView, currentConfig } from "../config/runtime";
import type { Env } from "../env";
import { DISAGG_DECISIONS } from "../routing/local-prefill";
import type { RouterError } from "../errors";
import { TIERS } from "../config/cluster-view";
import { ADMISSION_REFUSALS, emptyHistogram, PREDICTION_RATIO_BOUNDS } from "./cluster-snapshot";
import type { Role } from "../routing/types";
import type { ClusterSnapshot, Histogram, HistoryPoint, KeyCount } from "./cluster-snapshot";
import { background, logRequest } from "./log";
import type { MetricFamily, Sample } from "./prometheus";

/** What /metrics is built from: the Durable Object's shared state plus the isolate's view of the document. */
export interface MetricsInput {
  snapshot: ClusterSnapshot;
  keys: KeyCount[];
  config: { valid: boolean; stale: boolean; problems: number; served: boolean };
}

const BREAKER_STATES = ["closed", "open", "half_open"] as const;

type Node = ClusterSnapshot["nodes"][number];
const family = (name: string, type: "counter" | "gauge", help: string, samples: Sample[]): MetricFamily => ({ name: `pd_router_${name}`, help, type, samples });
const histogram = (name: string, help: string, h: Histogram): MetricFamily => ({ name: `pd_router_${name}`, help, type: "histogram", samples: [h] });
const one = (value: number | boolean): Sample[] => [{ value: +value }];

/**
 * The metric families of the router (docs/operations.md, Metrics: the HELP texts are one line, the table has
 * the detail). Pure: no env, no clock.
 */
export function clusterMetrics({ snapshot, keys, config }: MetricsInput): MetricFamily[] {
  const { nodes, prefix, admission } = snapshot;
  const perNode = (value: (n: Node) => number | boolean): Sample[] => nodes.map((n) => ({ labels: { node: n.id }, value: +value(n) }));
  const byRole = (value: (n: Node, role: Role) => number): Sample[] => nodes.flatMap((n) => n.roles.map((role) => ({ labels: { node: n.id, role }, value: value(n, role) })));
  // engine signals: only the nodes whose /metrics answered
  const signal = (value: (s: NonNullable<Node["signals"]>) => number | boolean | null | undefined): Sample[] =>
    nodes.flatMap((n) => {
      const v = n.signals ? value(n.signals) : null;
      return v == null ? [] : [{ labels: { node: n.id }, value: +v }];
    });
  return [
    family(
      "requests_total",
      "counter",
      "Requests answered, by route and status.",
      snapshot.requests.map((r) => ({ labels: { route: r.route, status: String(r.status) }, value: r.count })),
    ),
    family(
      "node_requests_total",
      "counter",
      "Requests routed to the node, by role.",
      byRole((n, role) => n.requestsTotal[role]),
    ),
    family(
      "node_failures_total",
      "counter",
      "Failures through the node's fault.",
      perNode((n) => n.failuresTotal),
    ),
    family(
      "node_usage_anomalies_total",
      "counter",
      "Answers whose reported cached tokens were impossible (negative, above the prompt), clamped.",
      perNode((n) => n.usageAnomalies),
    ),
    family(
      "node_inflight",
      "gauge",
      "Prefill legs and decode streams on the node.",
      perNode((n) => n.inflight.prefill + n.inflight.decode),
    ),
    family(
      "node_inflight_by_role",
      "gauge",
      "In-flight requests, by role.",
      byRole((n, role) => n.inflight[role]),
    ),
    family(
      "node_inflight_tokens",
      "gauge",
      "Prompt tokens of open decode streams.",
      perNode((n) => n.inflight.tokens),
    ),
    family(
      "node_inflight_prefill_tokens",
      "gauge",
      "Uncached prompt tokens of running prefills.",
      perNode((n) => n.inflight.prefillTokens),
    ),
    family(
      "node_healthy",
      "gauge",
      "1 when the node may take new work.",
      perNode((n) => n.healthy),
    ),
    family(
      "node_probe_up",
      "gauge",
      "1 when probes say up.",
      perNode((n) => n.probeUp),
    ),
    family(
      "node_draining",
      "gauge",
      "1 when draining.",
      perNode((n) => n.drain),
    ),
    family(
      "node_breaker_state",
      "gauge",
      "1 for the breaker's state.",
      nodes.flatMap((n) => BREAKER_STATES.map((state) => ({ labels: { node: n.id, state }, value: +(n.breaker === state) }))),
    ),
    family(
      "route_decisions_total",
      "counter",
      "Picks, by role and rule.",
      snapshot.decisions.map((d) => ({ labels: { role: d.role, rule: d.rule }, value: d.count })),
    ),
    family("disagg_decisions_total", "counter", "Requests, by mode and reason.", disaggSamples(snapshot.disagg)),
    family(
      "prefix_predicted_tokens_total",
      "counter",
      "Cached prompt tokens predicted.",
      perNode((n) => n.prefix.predictedTokens),
    ),
    family(
      "prefix_cached_tokens_total",
      "counter",
      "Cached prompt tokens reported.",
      perNode((n) => n.prefix.cachedTokens),
    ),
    family(
      "prefix_cache_lost_total",
      "counter",
      "Prefix caches found lost.",
      perNode((n) => n.prefix.cacheLost),
    ),
    family(
      "node_chars_per_token",
      "gauge",
      "Learned characters per token.",
      perNode((n) => n.prefix.charsPerToken),
    ),
    family("prefix_lookup_blocks_total", "counter", "Prefix blocks looked up.", one(prefix.lookedUpBlocks)),
    family("prefix_matched_blocks_total", "counter", "Prefix blocks matched.", one(prefix.matchedBlocks)),
    family("prefix_hit_ratio", "gauge", "Matched / looked-up blocks.", one(prefix.lookedUpBlocks > 0 ? prefix.matchedBlocks / prefix.lookedUpBlocks : 0)),
    family("prefix_index_entries", "gauge", "Prefix index entries.", [
      { labels: { role: "prefill" }, value: prefix.prefillEntries },
      { labels: { role: "decode" }, value: prefix.decodeEntries },
    ]),
    family(
      "node_prefill_tokens_per_second",
      "gauge",
      "Learned prefill rate at context 0.",
      perNode((n) => n.rates?.prefillTokensPerS ?? 0),
    ),
    family(
      "node_decode_step_seconds",
      "gauge",
      "Learned decode step time.",
      perNode((n) => (n.rates?.decodeStepMs ?? 0) / 1000),
    ),
    family(
      "node_transfer_seconds_per_gb",
      "gauge",
      "Learned KV transfer time to the node.",
      perNode((n) => (n.rates?.transferMsPerGB ?? 0) / 1000),
    ),
    histogram(
      "ttft_prediction_ratio",
      "Actual / predicted TTFT of streamed requests (a non-streamed answer has no first token to time).",
      snapshot.prediction ?? emptyHistogram(PREDICTION_RATIO_BOUNDS),
    ),
    family(
      "routing_precision",
      "gauge",
      "Follow-ups that found their prefix, 15 min.",
      (snapshot.precision ?? []).map((p) => ({ labels: { pool: p.pool }, value: p.followUps > 0 ? p.precise / p.followUps : 0 })),
    ),
    // cells (docs/scaling.md): absent without them
    family(
      "node_cell",
      "gauge",
      "1 for the cell (object) a node is in.",
      nodes.flatMap((n) => (n.cell ? [{ labels: { node: n.id, cell: n.cell }, value: 1 }] : [])),
    ),
    family(
      "cell_leases",
      "gauge",
      "Leases a cell's object holds.",
      (snapshot.cells ?? []).map((c) => ({ labels: { cell: c.cell }, value: c.leases })),
    ),
    family(
      "cell_queued",
      "gauge",
      "Requests waiting at the edge in a cell.",
      (snapshot.cells ?? []).map((c) => ({ labels: { cell: c.cell }, value: c.queued })),
    ),
    histogram("decode_ttfb_seconds", "Decode leg to its first byte.", snapshot.latency.ttfb),
    histogram("prefill_seconds", "Prefill leg until P answered.", snapshot.latency.prefill),
    family(
      "node_kv_usage",
      "gauge",
      "Engine KV use (0..1).",
      signal((s) => s.kvUsage),
    ),
    family(
      "node_queue",
      "gauge",
      "Requests waiting in the engine.",
      signal((s) => s.waiting),
    ),
    family(
      "node_signals_age_seconds",
      "gauge",
      "Age of the engine reading.",
      signal((s) => s.ageMs / 1000),
    ),
    family(
      "node_busy",
      "gauge",
      "1 when the KV guard finds it busy.",
      signal((s) => s.busy),
    ),
    family(
      "admission_queued",
      "gauge",
      "Requests waiting at the edge, by tier.",
      TIERS.map((tier) => ({ labels: { tier }, value: admission.queuedByTier?.find((q) => q.tier === tier)?.count ?? 0 })),
    ),
    histogram("admission_wait_seconds", "Edge wait of admitted requests.", admission.wait),
    family(
      "admission_rejected_total",
      "counter",
      "Requests refused at the edge.",
      ADMISSION_REFUSALS.flatMap((reason) =>
        TIERS.map((tier) => ({
          labels: { reason, tier },
          // an object from before tiers counted its refusals without one: they were all `default`
          value: admission.rejected.find((r) => r.reason === reason && (r.tier ?? "default") === tier)?.count ?? 0,
        })),
      ),
    ),
    family("leases", "gauge", "Requests holding a lease.", one(snapshot.leases)),
    family("leases_expired_total", "counter", "Leases expired unreleased.", one(snapshot.expiredLeases)),
    family(
      "key_requests_total",
      "counter",
      "Requests, by API key label.",
      keys.map((k) => ({ labels: { key: k.key }, value: k.count })),
    ),
    family("config_valid", "gauge", "1 when the stored document is valid.", one(config.valid)),
    family("config_stale", "gauge", "1 when an older document serves.", one(config.stale)),
    family("config_problems", "gauge", "Problems in the stored document.", one(config.problems)),
    family("config_serving", "gauge", "1 when a valid document serves.", one(config.served)),
  ];
}

/** Every valid (mode, reason) at 0 from the start, then any other the object counted. */
function disaggSamples(counted: ClusterSnapshot["disagg"]): Sample[] {
  // a counted pair replaces its zero in place (a Map keeps a key's first position)
  const rows = new Map([...DISAGG_DECISIONS.map((d) => ({ ...d, count: 0 })), ...counted].map((d) => [`${d.mode} ${d.reason}`, d]));
  return [...rows.values()].map((d) => ({ labels: { mode: d.mode, reason: d.reason }, value: d.count }));
}

const KNOWN_ROUTES = new Set([
  "/v1/chat/completions",
  "/v1/completions",
  "/v1/responses",
  "/v1/embeddings",
  "/tokenize",
  "/detokenize",
  "/generate",
  "/v1/models",
  "/v1/route",
  "/healthz",
  "/metrics",
  "/status",
  "/status.json",
]);

/** The `route` label: a known path, `/admin`, or `other` (an unknown path must not mint a new series). */
export function routeLabel(path: string): string {
  if (KNOWN_ROUTES.has(path)) return path;
  if (path === "/admin" || path.startsWith("/admin/")) return "/admin";
  return "other";
}

/** Counts (and logs) a request refused before routing: bad input, auth, limits, unknown route or model. */
export function recordRejected(c: Context<{ Bindings: Env; Variables: { requestId: string; keyLabel?: string } }>, error: RouterError): void {
  if (error.counted) return;
  const route = routeLabel(c.req.path);
  logRequest({ requestId: c.get("requestId") ?? "", route, status: error.status, outcome: "rejected", error: error.code, totalMs: 0 });
  // an authenticated inference request refused before routing: its key is counted here
  background(c, clusterState(c.env).count(route, error.status, c.get("keyLabel")));
}

/** Counts a successful answer of a route that takes no lease (models, dry runs). */
export function recordAnswered(c: Context<{ Bindings: Env; Variables: { requestId: string } }>, status: number): void {
  background(c, clusterState(c.env).count(routeLabel(c.req.path), status));
}

/**
 * The shared state as operators see it. Passing the served document's view to the Durable
 * Object makes every configured node appear (at 0) before any request was routed.
 */
export async function readClusterStatus(
  env: Env,
  { history = false }: { history?: boolean } = {},
): Promise<{ config: ConfigSnapshot; snapshot: ClusterSnapshot; keys: KeyCount[] }> {
  const config = await currentConfig(env);
  const whole = clusterState(env);
  const pools = config.config ? routingUnits(config.config) : [];
  // one object per independent node pool (or per cell of one); the whole cluster's also counts refused requests and keys
  const [keys, wholeSnapshot, ...poolSnapshots] = await Promise.all([
    whole.keyCounts(),
    pools.length === 1 ? whole.snapshot(clusterView(config.config!, config.version, pools[0]), history) : whole.snapshot(undefined, history),
    ...(pools.length > 1 ? pools.map((p) => clusterState(env, p.key).snapshot(clusterView(config.config!, config.version, p), history)) : []),
  ]);
  // a pool's pollers are named with the pool they poll for (the merged snapshot lists them all)
  const named = (snap: ClusterSnapshot, pool: string): ClusterSnapshot => (snap.pollers ? { ...snap, pollers: snap.pollers.map((p) => ({ ...p, pool })) } : snap);
  const snapshot = mergeSnapshots(
    pools.length === 1 ? named(wholeSnapshot, pools[0]!.key) : wholeSnapshot,
    poolSnapshots.map((snap, i) => named(snap, pools[i]!.key)),
  );
  return { config, snapshot: (config.config?.cells ?? 1) > 1 ? withCells(snapshot, pools, poolSnapshots) : snapshot, keys };
}

/** Cells (docs/scaling.md): each node named with its cell, and each cell's leases and waiting requests. */
function withCells(snapshot: ClusterSnapshot, cells: NodePool[], snapshots: ClusterSnapshot[]): ClusterSnapshot {
  const cellOf = new Map(cells.flatMap((c) => c.nodes.map((n) => [n.id, c.key] as const)));
  return {
    ...snapshot,
    nodes: snapshot.nodes.map((n) => ({ ...n, cell: cellOf.get(n.id) ?? null })),
    cells: cells.map((c, i) => ({ cell: c.key, nodes: c.nodes.map((n) => n.id), leases: snapshots[i]!.leases, queued: snapshots[i]!.admission.queued })),
  };
}

/** The whole cluster's snapshot with the pools' nodes, leases and counters added (pools share no node). */
export function mergeSnapshots(whole: ClusterSnapshot, pools: ClusterSnapshot[]): ClusterSnapshot {
  if (pools.length === 0) return whole;
  const all = [whole, ...pools];
  const total = (list: ClusterSnapshot[], pick: (s: ClusterSnapshot) => number) => list.reduce((n, s) => n + pick(s), 0);
  // counters by their labels (all fields but the count), summed
  const sum = <T extends { count: number }>(pick: (s: ClusterSnapshot) => T[]): T[] => {
    const m = new Map<string, T>();
    for (const t of all.flatMap(pick)) {
      const k = JSON.stringify({ ...t, count: 0 });
      m.set(k, { ...t, count: (m.get(k)?.count ?? 0) + t.count });
    }
    return [...m.values()];
  };
  const histogram = (pick: (s: ClusterSnapshot) => Histogram): Histogram => {
    const first = pick(whole);
    return {
      bounds: first.bounds,
      counts: first.counts.map((_, i) => total(all, (s) => pick(s).counts[i] ?? 0)),
      sum: total(all, (s) => pick(s).sum),
      count: total(all, (s) => pick(s).count),
    };
  };
  const prefix = (key: keyof ClusterSnapshot["prefix"]) => total(pools, (s) => s.prefix[key]);
  return {
    version: pools[0]!.version,
    nodes: pools.flatMap((p) => p.nodes),
    leases: total(all, (s) => s.leases),
    expiredLeases: total(all, (s) => s.expiredLeases),
    requests: sum((s) => s.requests),
    decisions: sum((s) => s.decisions),
    disagg: sum((s) => s.disagg ?? []),
    prefix: Object.fromEntries(Object.keys(whole.prefix).map((k) => [k, prefix(k as keyof ClusterSnapshot["prefix"])])) as ClusterSnapshot["prefix"],
    latency: { ttfb: histogram((s) => s.latency.ttfb), prefill: histogram((s) => s.latency.prefill) },
    admission: {
      queued: total(all, (s) => s.admission.queued),
      queuedByTier: sum((s) => s.admission.queuedByTier ?? []),
      wait: histogram((s) => s.admission.wait),
      rejected: sum((s) => s.admission.rejected),
    },
    history: mergeHistory(pools.map((p) => p.history)),
    prediction: histogram((s) => s.prediction ?? emptyHistogram(PREDICTION_RATIO_BOUNDS)),
    precision: pools.flatMap((p) => p.precision ?? []),
    pollers: pools.flatMap((p) => p.pollers ?? []),
    now: Math.max(...all.map((s) => s.now)),
  };
}

/** The pools' histories as one: each pool samples on its own alarm, so a point joins the nodes every pool had last at that time. */
export function mergeHistory(histories: HistoryPoint[][]): HistoryPoint[] {
  if (histories.length <= 1) return histories[0] ?? [];
  const times = [...new Set(histories.flatMap((h) => h.map((p) => p.t)))].sort((a, b) => a - b);
  return times.map((t) => {
    const lasts = histories.map((h) => {
      let last: HistoryPoint | undefined;
      for (const p of h) if (p.t <= t) last = p;
      return last;
    });
    return { t, nodes: lasts.flatMap((p) => p?.nodes ?? []), routed: lasts.reduce((n, p) => n + (p?.routed ?? 0), 0) };
  });
}
