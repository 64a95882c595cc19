import * as v from "valibot";
import { DEFAULT_MAX_BLOCKS_PER_REQUEST } from "../routing/prefix-index";
import { check, finite, gtValue, integer, maxLength, maxValue, minLength, minValue, oneOf, regex, renderPath, strictObject } from "./validation";

// The cluster document (SPEC section 2). Parsed once at the edge; the rest of the
// code receives a typed, defaults-filled ClusterConfig.

interface Bounds {
  min?: number;
  minMessage?: string;
  max: number;
  maxMessage?: string;
}
/** An integer within bounds. */
const int = ({ min = -Infinity, minMessage, max, maxMessage }: Bounds) => v.pipe(v.number(), integer(), minValue(min, minMessage), maxValue(max, maxMessage));
/** An integer above 0 within bounds (checked in this order, so its problems are listed in it). */
const positiveInt = ({ min = -Infinity, minMessage, max, maxMessage }: Bounds) => v.pipe(v.number(), integer(), gtValue(0), minValue(min, minMessage), maxValue(max, maxMessage));
/** A number within [min, max]. */
const between = (min: number, max: number) => v.pipe(v.number(), minValue(min), maxValue(max));
/** A leg timeout: at least 50 ms (anything shorter fails every request), at most `max`. */
const timeoutMs = (max: number, what: string) => positiveInt({ min: 50, minMessage: "must be at least 50 (ms)", max, maxMessage: `must be at most ${max} (${what})` });
/** Probe, failure and recovery counts: a hundred is already more than anyone means. */
const count = positiveInt({ max: 100, maxMessage: "must be at most 100" });

const nodeUrl = v.pipe(
  v.string(),
  v.rawCheck(({ dataset, addIssue }) => {
    if (!dataset.typed) return;
    const value = dataset.value;
    let url: URL;
    try {
      url = new URL(value);
    } catch {
      addIssue({ message: "must be an absolute http or https URL" });
      return;
    }
    const problems: string[] = [];
    if (url.protocol !== "http:" && url.protocol !== "https:") problems.push("scheme must be http or https");
    if (url.username || url.password) problems.push("must not carry credentials");
    if (url.pathname !== "/" || url.search || url.hash || /[?#]/.test(value)) problems.push("must be an origin without path, query or fragment");
    if (problems.length) addIssue({ message: problems.join("; ") });
  }),
);

/** A NODE_* secret name: a document can only name the secrets kept for nodes, never the router's own. */
const nodeSecretName = (what: string) =>
  v.pipe(v.string(), regex(/^NODE_[A-Za-z0-9_]{1,123}$/, `must name a NODE_* Worker secret (holding ${what}), never one of the router's own secrets`));

/**
 * How the router reaches a node (src/config/node-access.ts). `binding`: a Workers VPC binding
 * (`vpc_networks` or `vpc_services` in wrangler.toml) whose `fetch` carries the request into the
 * private network; only VPC_* names, so a document can never make the router call its own KV or
 * Durable Object. `access`: a Cloudflare Access service token, sent as CF-Access-Client-Id /
 * CF-Access-Client-Secret, read from the NODE_* secrets named here. Empty: plain `fetch`.
 */
export const ReachSchema = strictObject({
  binding: v.optional(v.pipe(v.string(), regex(/^VPC_[A-Za-z0-9_]{1,123}$/, "must name a VPC_* Workers VPC binding"))),
  access: v.optional(
    strictObject({
      clientId: nodeSecretName("the service token's client ID"),
      clientSecret: nodeSecretName("the service token's client secret"),
    }),
  ),
});

const HOST_MESSAGE = "must be a host name or an IP address, without scheme or port";
/** The host as a URL parses it, or null: IPv6 literals (given with or without brackets) keep their brackets. */
function urlHost(value: string): string | null {
  const host = value.includes(":") && !value.startsWith("[") ? `[${value}]` : value;
  let parsed: URL;
  try {
    parsed = new URL(`http://${host}/`);
  } catch {
    return null;
  }
  return parsed.hostname !== host.toLowerCase() || parsed.port !== "" || /[/?#@]/.test(value) ? null : parsed.hostname;
}

/**
 * A host as it goes into a URL: a DNS name, an IPv4 literal, or an IPv6 literal (given with or
 * without brackets, kept with them: SGLang and vLLM build `http://{host}:{port}` from it).
 */
const bootstrapHost = v.pipe(
  v.string(),
  maxLength(253),
  // checked even when too long, so both problems are reported together; kept as urlHost writes it (parseClusterDocument)
  v.rawCheck(({ dataset, addIssue }) => {
    if (dataset.typed && urlHost(dataset.value) === null) addIssue({ message: HOST_MESSAGE });
  }),
);

// SPEC 9 `profile`: the prior of each node's learned rates (src/state/node-rates.ts), per pool and
// per node; a node's fields override the pool's, absent ones are the defaults shown in SPEC 9.
const ProfileSchema = strictObject({
  prefillTokensPerS: v.optional(v.pipe(v.number(), gtValue(0, "must be above 0"), maxValue(10_000_000))),
  decodeStepMs: v.optional(v.pipe(v.number(), gtValue(0, "must be above 0"), maxValue(60_000))),
  transferGBPerS: v.optional(v.pipe(v.number(), gtValue(0, "must be above 0"), maxValue(10_000))),
});

export const NodeSchema = strictObject({
  id: v.pipe(v.string(), regex(/^[A-Za-z0-9._-]{1,64}$/, "must match [A-Za-z0-9._-]{1,64}")),
  url: nodeUrl,
  role: oneOf(["prefill", "decode", "both"]),
  group: v.optional(v.pipe(v.string(), minLength(1), maxLength(128))),
  weight: v.optional(v.pipe(v.number(), gtValue(0), finite()), 1),
  models: v.optional(v.array(v.pipe(v.string(), minLength(1)))),
  bootstrapPort: v.optional(positiveInt({ max: 65535 }), 8998),
  // the address decode nodes use to reach this node's bootstrap server; default the URL's host
  bootstrapHost: v.optional(bootstrapHost),
  // how the router reaches this node; replaces the document's `reach` (an empty object: directly)
  reach: v.optional(ReachSchema),
  drain: v.optional(v.boolean(), false),
  // SPEC 8: the node can prefill a request itself as a decode node (conditional disaggregation);
  // absent: true for vllm / vllm-mooncake decode-capable nodes, false under sglang (localPrefillOf)
  localPrefill: v.optional(v.boolean()),
  // SPEC 9: the node runs vLLM with --scheduling-policy priority: its requests carry `priority` from their tier
  priorityScheduling: v.optional(v.boolean()),
  // Only NODE_* secrets: whoever edits the document must not be able to make the router send
  // its own secrets (ADMIN_TOKEN, API_KEYS, METRICS_TOKEN) to a host of their choosing.
  apiKeySecret: v.optional(nodeSecretName("the node's bearer token")),
  // the vLLM version the node runs; absent: 0.21 or newer (src/forward/handle-release.ts says what it decides)
  vllmVersion: v.optional(v.pipe(v.string(), regex(/^\d+\.\d+(\.\d+)?([.+-][0-9A-Za-z.+-]*)?$/, 'must be a vLLM version such as "0.20.2"'))),
  // SPEC 9: this node's prior rates, over the document's `profile`
  profile: v.optional(ProfileSchema),
});

const POLICIES = ["round_robin", "affinity", "cache_aware", "least_load"] as const;
const PROTOCOLS = ["vllm", "vllm-mooncake", "sglang", "colocated"] as const;

const PolicySchema = strictObject({
  prefill: v.optional(oneOf(POLICIES)),
  decode: v.optional(oneOf(POLICIES)),
  pdGroup: v.optional(oneOf(["off", "prefer", "strict"]), "off"),
  pdGroupBonus: v.optional(between(0, 10), 0.3),
  loadFactor: v.optional(between(1, 100), 1.25),
  loadSlack: v.optional(int({ min: 0, max: 1000 }), 4),
  // SPEC 8: `always` disaggregates every request; `conditional` picks D first and prefills on D
  // alone when the prompt's uncached tokens there are few (both thresholds) and D is not busy
  disaggregation: v.optional(oneOf(["always", "conditional", "predicted"]), "always"),
  localPrefillTokens: v.optional(int({ min: 0, max: 10_000_000 }), 2048),
  localPrefillRatio: v.optional(between(0, 1), 0.7),
  cacheAware: v.optional(
    strictObject({
      blockChars: v.optional(positiveInt({ min: 64, max: 65536 }), 2048),
      loadFactor: v.optional(between(1, 100), 3),
      shareFactor: v.optional(between(1, 100), 1.1),
      shareHalfLife: v.optional(positiveInt({ max: 1_000_000 }), 1000),
      maxBlocksPerRequest: v.optional(positiveInt({ max: 100_000 }), DEFAULT_MAX_BLOCKS_PER_REQUEST),
    }),
    {},
  ),
});

const TimeoutsSchema = strictObject({
  prefillMs: v.optional(timeoutMs(600_000, "10 minutes"), 120_000),
  decodeFirstByteMs: v.optional(timeoutMs(600_000, "10 minutes"), 120_000),
  decodeIdleMs: v.optional(timeoutMs(600_000, "10 minutes"), 120_000),
  // a whole non-streamed generation: long outputs on a busy node take a while
  nonStreamMs: v.optional(timeoutMs(21_600_000, "6 hours"), 3_600_000),
});

const AT_LEAST_100_MS = "must be at least 100 (ms)";
const AT_LEAST_1_S = "must be at least 1000 (ms)";
const AT_MOST_1_HOUR = "must be at most 3600000 (1 hour)";
const AT_MOST_1_DAY = "must be at most 86400000 (1 day)";

// probeTimeoutMs and probePath have protocol-dependent defaults: see probeSettings (src/state/health.ts).
const HealthSchema = strictObject({
  intervalMs: v.optional(positiveInt({ min: 1_000, minMessage: AT_LEAST_1_S, max: 3_600_000, maxMessage: AT_MOST_1_HOUR }), 10_000),
  probeTimeoutMs: v.optional(positiveInt({ min: 50, minMessage: "must be at least 50 (ms)", max: 60_000, maxMessage: "must be at most 60000 (1 minute)" })),
  probePath: v.optional(v.pipe(v.string(), regex(/^\/[A-Za-z0-9._~/-]{0,255}$/, "must be a path starting with / (no query)"))),
  downAfter: v.optional(count, 2),
  upAfter: v.optional(count, 2),
  ejectAfter: v.optional(count, 3),
  ejectBaseMs: v.optional(positiveInt({ min: 100, minMessage: AT_LEAST_100_MS, max: 3_600_000, maxMessage: AT_MOST_1_HOUR }), 10_000),
  ejectMaxMs: v.optional(positiveInt({ min: 100, minMessage: AT_LEAST_100_MS, max: 86_400_000, maxMessage: AT_MOST_1_DAY }), 300_000),
});

// ---- engine signals and admission (SPEC 8) ----
// signals: how often the object polls each node's /metrics, when a reading is too old to use, and
// the decode KV guard's thresholds. admission: how long and how many requests may wait at the
// edge when every decode node that could serve them is busy.
// Sharded polling (docs/scaling.md): one invocation has six connections waiting for headers, so at
// 50 ms to headers it sends at most 6 / 0.05 = 120 fetches a second. The pool object's alarm sends
// n / 10 s probes and n / 5 s polls a second at the defaults (0.3 n): 400 nodes fill it. Tunnels
// slower than 50 ms (80 ms: 75 fetches a second, 250 nodes) leave less, so above 256 nodes the
// polls go to poller objects, each 128 nodes (26 polls a second: a fifth of its own six slots).
/** A pool of more nodes than this hands its /metrics polls to poller objects. */
export const DEFAULT_SHARD_ABOVE = 256;
/** The nodes one poller object polls (at most; rendezvous spreads them, so about). */
export const DEFAULT_NODES_PER_POLLER = 128;

const SignalsSchema = strictObject({
  intervalMs: v.optional(positiveInt({ min: 1_000, minMessage: AT_LEAST_1_S, max: 3_600_000, maxMessage: AT_MOST_1_HOUR }), 5_000),
  shardAbove: v.optional(positiveInt({ max: 100_000, maxMessage: "must be at most 100000" }), DEFAULT_SHARD_ABOVE),
  nodesPerPoller: v.optional(positiveInt({ max: 10_000, maxMessage: "must be at most 10000" }), DEFAULT_NODES_PER_POLLER),
  staleMs: v.optional(positiveInt({ min: 1_000, minMessage: AT_LEAST_1_S, max: 86_400_000, maxMessage: AT_MOST_1_DAY }), 15_000),
  kvBusy: v.optional(v.pipe(v.number(), gtValue(0, "must be above 0"), maxValue(1, "must be at most 1")), 0.9),
  queueBusy: v.optional(positiveInt({ max: 100_000, maxMessage: "must be at most 100000" }), 8),
});

const AdmissionSchema = strictObject({
  queueMs: v.optional(int({ min: 0, minMessage: "must be 0 (no waiting) or more", max: 600_000, maxMessage: "must be at most 600000 (10 minutes)" }), 30_000),
  maxQueued: v.optional(int({ min: 0, minMessage: "must be 0 (no queue) or more", max: 100_000, maxMessage: "must be at most 100000" }), 1000),
  // SPEC 9: a flex request predicted to miss this TTFT is refused at once; fair share across API keys
  ttftSloMs: v.optional(v.nullable(positiveInt({ max: 600_000, maxMessage: "must be at most 600000 (10 minutes)" })), null),
  fairShare: v.optional(oneOf(["apiKey", "none"]), "apiKey"),
  // SPEC 9: the share of each decode node's KV kept for `priority` requests (the KV guard judges the
  // others at signals.kvBusy less it), so a priority request finds room when the rest must wait
  priorityReserve: v.optional(v.pipe(v.number(), minValue(0, "must be 0 (no reserve) or more"), maxValue(0.5, "must be at most 0.5")), 0),
});

export const ClusterDocumentSchema = strictObject({
  protocol: v.optional(oneOf(PROTOCOLS)),
  policy: v.optional(PolicySchema, {}),
  timeouts: v.optional(TimeoutsSchema, {}),
  health: v.optional(HealthSchema, {}),
  // how every node is reached unless it names its own `reach`
  reach: v.optional(ReachSchema),
  signals: v.optional(SignalsSchema, {}),
  admission: v.optional(AdmissionSchema, {}),
  profile: v.optional(ProfileSchema),
  // docs/scaling.md: each pool cut into this many cells, each an object of its own (1: the pool is one object)
  cells: v.optional(positiveInt({ max: 64, maxMessage: "must be at most 64" }), 1),
  nodes: v.pipe(v.array(NodeSchema), minLength(1, "must list at least one node")),
});

/**
 * Duplicate node ids, checked on the raw value so they are reported together with every other
 * problem (a check on the parsed document would only run once the rest of it is valid).
 */
function duplicateIds(value: unknown): Problem[] {
  const nodes = (value as { nodes?: unknown } | null)?.nodes;
  if (!Array.isArray(nodes)) return [];
  const seen = new Set<string>();
  const problems: Problem[] = [];
  nodes.forEach((node, i) => {
    const id = (node as { id?: unknown } | null)?.id;
    if (typeof id !== "string") return;
    if (seen.has(id)) problems.push({ path: `nodes[${i}].id`, message: `duplicate node id "${id}"` });
    seen.add(id);
  });
  return problems;
}

type ParsedDocument = v.InferOutput<typeof ClusterDocumentSchema>;
export type NodeReach = v.InferOutput<typeof ReachSchema>;
/** A node with its defaults filled: its bootstrap host and how it is reached are always known. */
export type NodeConfig = v.InferOutput<typeof NodeSchema> & { bootstrapHost: string; reach: NodeReach };
export type Protocol = "vllm" | "vllm-mooncake" | "sglang" | "colocated";
export type ClusterConfig = Omit<ParsedDocument, "protocol" | "policy" | "nodes" | "reach"> & {
  protocol: Protocol;
  policy: Required<ParsedDocument["policy"]>;
  nodes: NodeConfig[];
};

export interface Problem {
  /** where in the document, e.g. `nodes[1].url` */
  path: string;
  message: string;
}

export interface ConfigDefaults {
  protocol?: string | undefined;
  policy?: string | undefined;
  /** the WORKERS_PLAN var: the subrequests one invocation may send (src/config/plan.ts) */
  plan?: string | undefined;
  /**
   * the plan's check (plan.ts withPlanLimits adds it: plan.ts reads this module's types, so this
   * module cannot import it); absent: no plan check. Data crosses RPC, a function does not: add it
   * where the document is parsed.
   */
  limits?: ((config: ClusterConfig) => Problem[]) | undefined;
}

export type ParseResult = { ok: true; config: ClusterConfig } | { ok: false; problems: Problem[] };

/** Protocols that send a request to a prefill node and then (or also) to a decode node. */
export const DISAGGREGATED_PROTOCOLS: readonly Protocol[] = ["vllm", "vllm-mooncake", "sglang"];
/** Validates a raw document (text or value) and fills in the defaults. Never throws. */
export function parseClusterDocument(raw: unknown, defaults: ConfigDefaults = {}): ParseResult {
  let value = raw;
  if (typeof raw === "string") {
    try {
      value = JSON.parse(raw);
    } catch (err) {
      return { ok: false, problems: [{ path: "(document)", message: `not valid JSON: ${(err as Error).message}` }] };
    }
  }
  const parsed = check(ClusterDocumentSchema, value);
  const duplicates = duplicateIds(value);
  if (!parsed.ok || duplicates.length > 0) {
    const issues = parsed.ok ? [] : parsed.issues.map((issue) => ({ path: renderPath(issue.path) || "(document)", message: issue.message }));
    return { ok: false, problems: [...issues, ...duplicates] };
  }
  const doc = parsed.value;
  const defaultProtocol = PROTOCOLS.find((p) => p === defaults.protocol) ?? "vllm";
  const defaultPolicy = POLICIES.find((p) => p === defaults.policy) ?? "affinity";
  const { reach, ...rest } = doc;
  const config: ClusterConfig = {
    ...rest,
    protocol: doc.protocol ?? defaultProtocol,
    policy: { ...doc.policy, prefill: doc.policy.prefill ?? defaultPolicy, decode: doc.policy.decode ?? defaultPolicy },
    nodes: doc.nodes.map((n) => ({
      ...n,
      bootstrapHost: n.bootstrapHost === undefined ? new URL(n.url).hostname : (urlHost(n.bootstrapHost) as string),
      reach: n.reach ?? reach ?? {},
    })),
  };
  const unusable = [...usabilityProblems(config), ...(defaults.limits?.(config) ?? [])];
  return unusable.length > 0 ? { ok: false, problems: unusable } : { ok: true, config };
}

/** Whether a node may prefill a request alone as a decode node (SPEC 8): its `localPrefill`, else true for vLLM decode-capable nodes. */
export function localPrefillOf(node: Pick<NodeConfig, "role" | "localPrefill">, protocol: Protocol): boolean {
  if (node.role === "prefill") return false;
  return node.localPrefill ?? (protocol === "vllm" || protocol === "vllm-mooncake");
}

/**
 * What each field's own bounds cannot see: a document that parses but could not work (a breaker
 * that never backs off, a probe that outlives its interval, a P/D protocol without a P or a D).
 */
function usabilityProblems(config: ClusterConfig): Problem[] {
  const problems: Problem[] = [];
  const h = config.health;
  if (h.probeTimeoutMs !== undefined && h.probeTimeoutMs >= h.intervalMs) {
    problems.push({ path: "health.probeTimeoutMs", message: `must be below health.intervalMs (${h.intervalMs})` });
  }
  if (config.signals.staleMs <= config.signals.intervalMs) {
    problems.push({ path: "signals.staleMs", message: `must be above signals.intervalMs (${config.signals.intervalMs})` });
  }
  if (h.ejectMaxMs < h.ejectBaseMs) {
    problems.push({ path: "health.ejectMaxMs", message: `must be at least health.ejectBaseMs (${h.ejectBaseMs})` });
  }
  if (config.protocol === "sglang") {
    // an SGLang decode-mode server only decodes what a prefill server sent it (SPEC 8)
    config.nodes.forEach((n, i) => {
      if (n.localPrefill === true) problems.push({ path: `nodes[${i}].localPrefill`, message: 'must not be true under protocol "sglang"' });
      // vLLM's priority field; SGLang's has its own scale and flags
      if (n.priorityScheduling === true) problems.push({ path: `nodes[${i}].priorityScheduling`, message: 'must not be true under protocol "sglang" (it sets vLLM\'s priority)' });
    });
  }
  if (DISAGGREGATED_PROTOCOLS.includes(config.protocol)) {
    for (const role of ["prefill", "decode"] as const) {
      if (!config.nodes.some((n) => n.role === role || n.role === "both")) {
        problems.push({ path: "nodes", message: `protocol "${config.protocol}" needs a ${role}-capable node (role "${role}" or "both")` });
      }
    }
  }
  return problems;
}
