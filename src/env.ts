/**
 * Bindings, vars and secrets of the Worker. The bindings (NODES, CLUSTER_STATE) come from
 * `wrangler types` (worker-configuration.d.ts, `npm run types`); the optional vars and secrets are
 * unset by default, so they are listed here. Read dynamically, by the names the cluster document
 * gives (src/config/node-access.ts): NODE_* secrets (a node's `apiKeySecret`, its Access service
 * token) and VPC_* bindings (`vpc_networks` / `vpc_services` a node is reached through; see
 * docs/deploy.md).
 */
export interface Env extends Cloudflare.Env {
  /** defaults for the cluster document, overridden by the KV document */
  DEFAULT_PROTOCOL?: string;
  DEFAULT_POLICY?: string;
  /** the Workers plan ("free" | "paid", default paid) or a `[limits] subrequests` number: a document needing more subrequests per invocation is refused */
  WORKERS_PLAN?: string;
  /** max request body in bytes (default 10 MB) */
  MAX_BODY_BYTES?: string;
  /** isolate cache TTL of the cluster document in ms (default 5000) */
  CONFIG_TTL_MS?: string;
  /** a request's lease expires this long after its last renewal (default 60000; live requests renew every third of it) */
  LEASE_TTL_MS?: string;
  /** P's good answer waits this long (ms) to travel with the finish report, default 250; 0: reported at once */
  PREFILL_REPORT_DELAY_MS?: string;
  /** a write to the client waiting this long ends the request: the client left or stopped reading (default 10000) */
  CLIENT_STALL_MS?: string;
  ADMIN_TOKEN?: string;
  API_KEYS?: string;
  METRICS_TOKEN?: string;
  STATUS_PUBLIC?: string;
  /** optional Workers rate-limiting binding (`[[ratelimits]]` in wrangler.toml) */
  RATE_LIMITER?: RateLimit;
  /** the binding's period in seconds, sent as `retry-after` when limited (default 60) */
  RATE_LIMIT_PERIOD_S?: string;
  /** test-only (the benchmark): `count_only` counts predicted vs reported cached tokens but never drops a node's prefix entries when it lost its cache */
  TEST_CACHE_FEEDBACK?: string;
  /** Durable Object location hint for the ClusterState objects (wnam, enam, sam, weur, eeur, apac, oc, afr, me): put them near the engines */
  STATE_LOCATION_HINT?: string;
  [secret: string]: unknown;
}
