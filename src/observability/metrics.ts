import type { Context } from "hono";
import type { ConfigSnapshot } from "../config/load";
import { nodePools } from "../config/pools";
import { clusterState, clusterView, currentConfig } from "../config/runtime";
import type { Env } from "../env";
import { DISAGG_DECISIONS } from "../routing/local-prefill";
import type { RouterError } from "../errors";
import type { HistoryPoint } from "../state/node-history";
import type { ClusterSnapshot, Histogram, KeyCount } from "../state/types";
import { background, logRequest } from "./log";
import type { MetricFamily, Sample } from "./prometheus";

/** What /metrics is built from: the Durable Object's shared state plus the isolate's view of the document. */
export interface MetricsInput {
  snapshot: ClusterSnapshot;
  keys: KeyCount[];
  config: { valid: boolean; stale: boolean; problems: number; served: boolean };
}

const BREAKER_STATES = ["closed", "open", "half_open"] as const;
const ADMISSION_REJECTIONS = ["queue_full", "timeout"] as const;

/** The metric families of the router (docs/operations.md lists them). Pure: no env, no clock. */
export function clusterMetrics({ snapshot, keys, config }: MetricsInput): MetricFamily[] {
  const nodes = snapshot.nodes;
  const perNode = (value: (n: (typeof nodes)[number]) => number): Sample[] => nodes.map((n) => ({ labels: { node: n.id }, value: value(n) }));
  const prefixRatio = snapshot.prefix.lookedUpBlocks > 0 ? snapshot.prefix.matchedBlocks / snapshot.prefix.lookedUpBlocks : 0;
  return [
    {
      name: "pd_router_requests_total",
      help: "Requests answered, by route and status (refused ones included).",
      type: "counter",
      samples: snapshot.requests.map((r) => ({ labels: { route: r.route, status: String(r.status) }, value: r.count })),
    },
    {
      name: "pd_router_node_requests_total",
      help: "Requests routed to the node, by role.",
      type: "counter",
      samples: nodes.flatMap((n) => n.roles.map((role) => ({ labels: { node: n.id, role }, value: n.requestsTotal[role] }))),
    },
    {
      name: "pd_router_node_failures_total",
      help: "Failures through the node's fault (connect, timeout, 5xx).",
      type: "counter",
      samples: perNode((n) => n.failuresTotal),
    },
    {
      name: "pd_router_node_inflight",
      help: "Prefill legs running plus decode streams open on the node.",
      type: "gauge",
      samples: perNode((n) => n.inflight.prefill + n.inflight.decode),
    },
    {
      name: "pd_router_node_inflight_by_role",
      help: "Requests in flight on the node, by role.",
      type: "gauge",
      samples: nodes.flatMap((n) => n.roles.map((role) => ({ labels: { node: n.id, role }, value: n.inflight[role] }))),
    },
    { name: "pd_router_node_inflight_tokens", help: "Estimated prompt tokens of the node's open decode streams.", type: "gauge", samples: perNode((n) => n.inflight.tokens) },
    {
      name: "pd_router_node_inflight_prefill_tokens",
      help: "Estimated uncached prompt tokens of the node's running prefills.",
      type: "gauge",
      samples: perNode((n) => n.inflight.prefillTokens),
    },
    { name: "pd_router_node_healthy", help: "1 when the node may take new work (probes up, not ejected).", type: "gauge", samples: perNode((n) => (n.healthy ? 1 : 0)) },
    { name: "pd_router_node_probe_up", help: "1 when the node's probes say up.", type: "gauge", samples: perNode((n) => (n.probeUp ? 1 : 0)) },
    { name: "pd_router_node_draining", help: "1 when the node is marked drain.", type: "gauge", samples: perNode((n) => (n.drain ? 1 : 0)) },
    {
      name: "pd_router_node_breaker_state",
      help: "1 for the node's current breaker state.",
      type: "gauge",
      samples: nodes.flatMap((n) => BREAKER_STATES.map((state) => ({ labels: { node: n.id, state }, value: n.breaker === state ? 1 : 0 }))),
    },
    {
      name: "pd_router_route_decisions_total",
      help: "Selections, by role and deciding rule.",
      type: "counter",
      samples: snapshot.decisions.map((d) => ({ labels: { role: d.role, rule: d.rule }, value: d.count })),
    },
    {
      name: "pd_router_disagg_decisions_total",
      help: "Requests by how they were served and why.",
      type: "counter",
      samples: disaggSamples(snapshot.disagg),
    },
    {
      name: "pd_router_prefix_predicted_tokens_total",
      help: "Prompt tokens predicted cached on the prefilling node.",
      type: "counter",
      samples: perNode((n) => n.prefix.predictedTokens),
    },
    {
      name: "pd_router_prefix_cached_tokens_total",
      help: "Prompt tokens the prefilling node reported cached.",
      type: "counter",
      samples: perNode((n) => n.prefix.cachedTokens),
    },
    {
      name: "pd_router_prefix_cache_lost_total",
      help: "Times the node's prefix cache was found lost.",
      type: "counter",
      samples: perNode((n) => n.prefix.cacheLost),
    },
    {
      name: "pd_router_node_chars_per_token",
      help: "Learned prompt characters per token.",
      type: "gauge",
      samples: perNode((n) => n.prefix.charsPerToken),
    },
    {
      name: "pd_router_prefix_lookup_blocks_total",
      help: "Prefix blocks looked up (cache_aware).",
      type: "counter",
      samples: [{ value: snapshot.prefix.lookedUpBlocks }],
    },
    {
      name: "pd_router_prefix_matched_blocks_total",
      help: "Prefix blocks the chosen node likely held.",
      type: "counter",
      samples: [{ value: snapshot.prefix.matchedBlocks }],
    },
    {
      name: "pd_router_prefix_hit_ratio",
      help: "Matched / looked-up prefix blocks.",
      type: "gauge",
      samples: [{ value: prefixRatio }],
    },
    {
      name: "pd_router_prefix_index_entries",
      help: "Prefix index entries, by role.",
      type: "gauge",
      samples: [
        { labels: { role: "prefill" }, value: snapshot.prefix.prefillEntries },
        { labels: { role: "decode" }, value: snapshot.prefix.decodeEntries },
      ],
    },
    { name: "pd_router_decode_ttfb_seconds", help: "Decode leg to its first byte.", type: "histogram", samples: [snapshot.latency.ttfb] },
    { name: "pd_router_prefill_seconds", help: "Prefill leg until P answered.", type: "histogram", samples: [snapshot.latency.prefill] },
    {
      name: "pd_router_node_kv_usage",
      help: "KV cache use (0..1) the engine reported at its last poll.",
      type: "gauge",
      samples: nodes.flatMap((n) => (n.signals?.kvUsage != null ? [{ labels: { node: n.id }, value: n.signals.kvUsage }] : [])),
    },
    {
      name: "pd_router_node_queue",
      help: "Requests waiting in the engine at its last poll.",
      type: "gauge",
      samples: nodes.flatMap((n) => (n.signals?.waiting != null ? [{ labels: { node: n.id }, value: n.signals.waiting }] : [])),
    },
    {
      name: "pd_router_node_signals_age_seconds",
      help: "Age of the node's last /metrics reading.",
      type: "gauge",
      samples: nodes.flatMap((n) => (n.signals ? [{ labels: { node: n.id }, value: n.signals.ageMs / 1000 }] : [])),
    },
    {
      name: "pd_router_node_busy",
      help: "1 when the decode KV guard finds the node busy.",
      type: "gauge",
      samples: nodes.flatMap((n) => (n.signals ? [{ labels: { node: n.id }, value: n.signals.busy ? 1 : 0 }] : [])),
    },
    {
      name: "pd_router_admission_queued",
      help: "Requests waiting at the edge.",
      type: "gauge",
      samples: [{ value: snapshot.admission.queued }],
    },
    {
      name: "pd_router_admission_wait_seconds",
      help: "Wait of requests admitted at the edge.",
      type: "histogram",
      samples: [snapshot.admission.wait],
    },
    {
      name: "pd_router_admission_rejected_total",
      help: "Requests refused 503 cluster_busy at the edge, by reason.",
      type: "counter",
      samples: ADMISSION_REJECTIONS.map((reason) => ({ labels: { reason }, value: snapshot.admission.rejected.find((r) => r.reason === reason)?.count ?? 0 })),
    },
    { name: "pd_router_leases", help: "Requests holding a load lease.", type: "gauge", samples: [{ value: snapshot.leases }] },
    {
      name: "pd_router_leases_expired_total",
      help: "Leases expired unreleased (counted as 499).",
      type: "counter",
      samples: [{ value: snapshot.expiredLeases }],
    },
    {
      name: "pd_router_key_requests_total",
      help: "Authenticated requests, by API key label.",
      type: "counter",
      samples: keys.map((k) => ({ labels: { key: k.key }, value: k.count })),
    },
    {
      name: "pd_router_config_valid",
      help: "1 when the stored document is valid.",
      type: "gauge",
      samples: [{ value: config.valid ? 1 : 0 }],
    },
    {
      name: "pd_router_config_stale",
      help: "1 when an older valid document serves.",
      type: "gauge",
      samples: [{ value: config.stale ? 1 : 0 }],
    },
    { name: "pd_router_config_problems", help: "Problems in the stored document.", type: "gauge", samples: [{ value: config.problems }] },
    { name: "pd_router_config_serving", help: "1 when a valid document serves.", type: "gauge", samples: [{ value: config.served ? 1 : 0 }] },
  ];
}

/** Every valid (mode, reason) at 0 from the start, then any other the object counted. */
function disaggSamples(counted: ClusterSnapshot["disagg"]): Sample[] {
  const key = (d: { mode: string; reason: string }) => `${d.mode} ${d.reason}`;
  const byKey = new Map(counted.map((d) => [key(d), d.count]));
  const known = new Set(DISAGG_DECISIONS.map(key));
  return [
    ...DISAGG_DECISIONS.map((d) => ({ labels: { mode: d.mode, reason: d.reason }, value: byKey.get(key(d)) ?? 0 })),
    ...counted.filter((d) => !known.has(key(d))).map((d) => ({ labels: { mode: d.mode, reason: d.reason }, value: d.count })),
  ];
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
  const pools = config.config ? nodePools(config.config) : [];
  // one object per independent node pool; the whole cluster's also counts refused requests and keys
  const [keys, wholeSnapshot, ...poolSnapshots] = await Promise.all([
    whole.keyCounts(),
    pools.length === 1 ? whole.snapshot(clusterView(config.config!, config.version, pools[0]), history) : whole.snapshot(undefined, history),
    ...(pools.length > 1 ? pools.map((p) => clusterState(env, p.key).snapshot(clusterView(config.config!, config.version, p), history)) : []),
  ]);
  return { config, snapshot: mergeSnapshots(wholeSnapshot, poolSnapshots), keys };
}

/** The whole cluster's snapshot with the pools' nodes, leases and counters added (pools share no node). */
export function mergeSnapshots(whole: ClusterSnapshot, pools: ClusterSnapshot[]): ClusterSnapshot {
  if (pools.length === 0) return whole;
  const all = [whole, ...pools];
  const sum = <T>(items: T[], key: (t: T) => string, count: (t: T) => number, make: (t: T, n: number) => T): T[] => {
    const m = new Map<string, { item: T; n: number }>();
    for (const t of items) {
      const k = key(t);
      const seen = m.get(k);
      m.set(k, { item: seen?.item ?? t, n: (seen?.n ?? 0) + count(t) });
    }
    return [...m.values()].map(({ item, n }) => make(item, n));
  };
  const histogram = (pick: (s: ClusterSnapshot) => Histogram) => {
    const first = pick(all[0]!);
    return {
      bounds: first.bounds,
      counts: first.counts.map((_, i) => all.reduce((n, s) => n + (pick(s).counts[i] ?? 0), 0)),
      sum: all.reduce((n, s) => n + pick(s).sum, 0),
      count: all.reduce((n, s) => n + pick(s).count, 0),
    };
  };
  return {
    version: pools[0]!.version,
    nodes: pools.flatMap((p) => p.nodes),
    leases: all.reduce((n, s) => n + s.leases, 0),
    expiredLeases: all.reduce((n, s) => n + s.expiredLeases, 0),
    requests: sum(
      all.flatMap((s) => s.requests),
      (r) => `${r.route} ${r.status}`,
      (r) => r.count,
      (r, count) => ({ ...r, count }),
    ),
    decisions: sum(
      all.flatMap((s) => s.decisions),
      (d) => `${d.role} ${d.rule}`,
      (d) => d.count,
      (d, count) => ({ ...d, count }),
    ),
    disagg: sum(
      all.flatMap((s) => s.disagg ?? []),
      (d) => `${d.mode} ${d.reason}`,
      (d) => d.count,
      (d, count) => ({ ...d, count }),
    ),
    prefix: {
      prefillEntries: pools.reduce((n, s) => n + s.prefix.prefillEntries, 0),
      decodeEntries: pools.reduce((n, s) => n + s.prefix.decodeEntries, 0),
      maxEntries: pools.reduce((n, s) => n + s.prefix.maxEntries, 0),
      lookedUpBlocks: pools.reduce((n, s) => n + s.prefix.lookedUpBlocks, 0),
      matchedBlocks: pools.reduce((n, s) => n + s.prefix.matchedBlocks, 0),
    },
    latency: { ttfb: histogram((s) => s.latency.ttfb), prefill: histogram((s) => s.latency.prefill) },
    admission: {
      queued: all.reduce((n, s) => n + s.admission.queued, 0),
      wait: histogram((s) => s.admission.wait),
      rejected: sum(
        all.flatMap((s) => s.admission.rejected),
        (r) => r.reason,
        (r) => r.count,
        (r, count) => ({ ...r, count }),
      ),
    },
    history: mergeHistory(pools.map((p) => p.history)),
    now: Math.max(...all.map((s) => s.now)),
  };
}

/** The pools' histories as one: each pool samples on its own alarm, so a point joins the nodes every pool had last at that time. */
export function mergeHistory(histories: HistoryPoint[][]): HistoryPoint[] {
  if (histories.length <= 1) return histories[0] ?? [];
  const times = [...new Set(histories.flatMap((h) => h.map((p) => p.t)))].sort((a, b) => a - b);
  return times.map((t) => ({
    t,
    nodes: histories.flatMap((h) => {
      let last: HistoryPoint | undefined;
      for (const p of h) if (p.t <= t) last = p;
      return last?.nodes ?? [];
    }),
  }));
}
