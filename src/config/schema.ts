import { z } from "zod";
import { DEFAULT_MAX_BLOCKS_PER_REQUEST } from "../routing/prefix-index";

// The cluster document (SPEC section 2). Parsed once at the edge; the rest of the
// code receives a typed, defaults-filled ClusterConfig.

const positiveInt = z.number().int().positive();
/** A leg timeout: at least 50 ms (anything shorter fails every request), at most `max`. */
const timeoutMs = (max: number, what: string) => positiveInt.min(50, "must be at least 50 (ms)").max(max, `must be at most ${max} (${what})`);
/** Probe, failure and recovery counts: a hundred is already more than anyone means. */
const count = positiveInt.max(100, "must be at most 100");

const nodeUrl = z.string().superRefine((value, ctx) => {
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    ctx.addIssue({ code: z.ZodIssueCode.custom, message: "must be an absolute http or https URL" });
    return;
  }
  const problems: string[] = [];
  if (url.protocol !== "http:" && url.protocol !== "https:") problems.push("scheme must be http or https");
  if (url.username || url.password) problems.push("must not carry credentials");
  if (url.pathname !== "/" || url.search || url.hash || /[?#]/.test(value)) problems.push("must be an origin without path, query or fragment");
  if (problems.length) ctx.addIssue({ code: z.ZodIssueCode.custom, message: problems.join("; ") });
});

/** A NODE_* secret name: a document can only name the secrets kept for nodes, never the router's own. */
const nodeSecretName = (what: string) =>
  z
    .string()
    .regex(
      /^NODE_[A-Za-z0-9_]{1,123}$/,
      `must be the name of a Worker secret starting NODE_ (the secret holds ${what}; node secrets live in that namespace, so a document can never point at the router's own secrets)`,
    );

/**
 * How the router reaches a node (src/forward/node-fetch.ts). `binding`: a Workers VPC binding
 * (`vpc_networks` or `vpc_services` in wrangler.toml) whose `fetch` carries the request into the
 * private network; only VPC_* names, so a document can never make the router call its own KV or
 * Durable Object. `access`: a Cloudflare Access service token, sent as CF-Access-Client-Id /
 * CF-Access-Client-Secret, read from the NODE_* secrets named here. Empty: plain `fetch`.
 */
export const ReachSchema = z
  .object({
    binding: z
      .string()
      .regex(/^VPC_[A-Za-z0-9_]{1,123}$/, "must be the name of a Workers VPC binding starting VPC_ (only bindings declared for reaching nodes)")
      .optional(),
    access: z
      .object({
        clientId: nodeSecretName("the service token's client ID"),
        clientSecret: nodeSecretName("the service token's client secret"),
      })
      .strict()
      .optional(),
  })
  .strict();

/**
 * A host as it goes into a URL: a DNS name, an IPv4 literal, or an IPv6 literal (given with or
 * without brackets, kept with them: SGLang and vLLM build `http://{host}:{port}` from it).
 */
const bootstrapHost = z
  .string()
  .max(253)
  .transform((value, ctx) => {
    const host = value.includes(":") && !value.startsWith("[") ? `[${value}]` : value;
    let parsed: URL | null = null;
    try {
      parsed = new URL(`http://${host}/`);
    } catch {
      // reported below
    }
    if (!parsed || parsed.hostname !== host.toLowerCase() || parsed.port !== "" || /[/?#@]/.test(value)) {
      ctx.addIssue({ code: z.ZodIssueCode.custom, message: "must be a host name or an IP address, without scheme or port" });
      return z.NEVER;
    }
    return parsed.hostname;
  });

export const NodeSchema = z
  .object({
    id: z.string().regex(/^[A-Za-z0-9._-]{1,64}$/, "must match [A-Za-z0-9._-]{1,64}"),
    url: nodeUrl,
    role: z.enum(["prefill", "decode", "both"]),
    group: z.string().min(1).max(128).optional(),
    weight: z.number().positive().finite().default(1),
    models: z.array(z.string().min(1)).optional(),
    bootstrapPort: positiveInt.max(65535).default(8998),
    // the address decode nodes use to reach this node's bootstrap server; default the URL's host
    bootstrapHost: bootstrapHost.optional(),
    // how the router reaches this node; replaces the document's `reach` (an empty object: directly)
    reach: ReachSchema.optional(),
    drain: z.boolean().default(false),
    // SPEC 8: the node can prefill a request itself as a decode node (conditional disaggregation);
    // absent: true for vllm / vllm-mooncake decode-capable nodes, false under sglang (localPrefillOf)
    localPrefill: z.boolean().optional(),
    // Only NODE_* secrets: whoever edits the document must not be able to make the router send
    // its own secrets (ADMIN_TOKEN, API_KEYS, METRICS_TOKEN) to a host of their choosing.
    apiKeySecret: nodeSecretName("the node's bearer token").optional(),
  })
  .strict();

const PolicySchema = z
  .object({
    prefill: z.enum(["round_robin", "affinity", "cache_aware", "least_load"]).optional(),
    decode: z.enum(["round_robin", "affinity", "cache_aware", "least_load"]).optional(),
    pdGroup: z.enum(["off", "prefer", "strict"]).default("off"),
    pdGroupBonus: z.number().min(0).max(10).default(0.3),
    loadFactor: z.number().min(1).max(100).default(1.25),
    loadSlack: z.number().int().min(0).max(1000).default(4),
    // SPEC 8: `always` disaggregates every request; `conditional` picks D first and prefills on D
    // alone when the prompt's uncached tokens there are few (both thresholds) and D is not busy
    disaggregation: z.enum(["always", "conditional"]).default("always"),
    localPrefillTokens: z.number().int().min(0).max(10_000_000).default(2048),
    localPrefillRatio: z.number().min(0).max(1).default(0.7),
    cacheAware: z
      .object({
        blockChars: positiveInt.min(64).max(65536).default(2048),
        loadFactor: z.number().min(1).max(100).default(3),
        shareFactor: z.number().min(1).max(100).default(1.1),
        shareHalfLife: positiveInt.max(1_000_000).default(1000),
        maxBlocksPerRequest: positiveInt.max(100_000).default(DEFAULT_MAX_BLOCKS_PER_REQUEST),
      })
      .strict()
      .default({}),
  })
  .strict();

const TimeoutsSchema = z
  .object({
    prefillMs: timeoutMs(600_000, "10 minutes").default(120_000),
    decodeFirstByteMs: timeoutMs(600_000, "10 minutes").default(120_000),
    decodeIdleMs: timeoutMs(600_000, "10 minutes").default(120_000),
    // a whole non-streamed generation: long outputs on a busy node take a while
    nonStreamMs: timeoutMs(21_600_000, "6 hours").default(3_600_000),
  })
  .strict();

// probeTimeoutMs and probePath have protocol-dependent defaults: see probeSettings (src/state/health.ts).
const HealthSchema = z
  .object({
    intervalMs: positiveInt.min(1_000, "must be at least 1000 (ms): shorter is a probe storm").max(3_600_000, "must be at most 3600000 (1 hour)").default(10_000),
    probeTimeoutMs: positiveInt.min(50, "must be at least 50 (ms)").max(60_000, "must be at most 60000 (1 minute)").optional(),
    probePath: z
      .string()
      .regex(/^\/[A-Za-z0-9._~/-]{0,255}$/, "must be a path starting with / (no query)")
      .optional(),
    downAfter: count.default(2),
    upAfter: count.default(2),
    ejectAfter: count.default(3),
    ejectBaseMs: positiveInt.min(100, "must be at least 100 (ms)").max(3_600_000, "must be at most 3600000 (1 hour)").default(10_000),
    ejectMaxMs: positiveInt.min(100, "must be at least 100 (ms)").max(86_400_000, "must be at most 86400000 (1 day)").default(300_000),
  })
  .strict();

// ---- engine signals and admission (SPEC 8) ----
// signals: how often the object polls each node's /metrics, when a reading is too old to use, and
// the decode KV guard's thresholds. admission: how long and how many requests may wait at the
// edge when every decode node that could serve them is busy.
const SignalsSchema = z
  .object({
    intervalMs: positiveInt.min(1_000, "must be at least 1000 (ms): engines pay for every scrape").max(3_600_000, "must be at most 3600000 (1 hour)").default(5_000),
    staleMs: positiveInt.min(1_000, "must be at least 1000 (ms)").max(86_400_000, "must be at most 86400000 (1 day)").default(15_000),
    kvBusy: z.number().gt(0, "must be above 0").max(1, "must be at most 1").default(0.9),
    queueBusy: positiveInt.max(100_000, "must be at most 100000").default(8),
  })
  .strict();

const AdmissionSchema = z
  .object({
    queueMs: z.number().int().min(0, "must be 0 (no waiting) or more").max(600_000, "must be at most 600000 (10 minutes)").default(30_000),
    maxQueued: z.number().int().min(0, "must be 0 (no queue) or more").max(100_000, "must be at most 100000").default(1000),
  })
  .strict();

export const ClusterDocumentSchema = z
  .object({
    protocol: z.enum(["vllm", "vllm-mooncake", "sglang", "colocated"]).optional(),
    policy: PolicySchema.default({}),
    timeouts: TimeoutsSchema.default({}),
    health: HealthSchema.default({}),
    // how every node is reached unless it names its own `reach`
    reach: ReachSchema.optional(),
    signals: SignalsSchema.default({}),
    admission: AdmissionSchema.default({}),
    nodes: z.array(NodeSchema).min(1, "must list at least one node"),
  })
  .strict();

/**
 * Duplicate node ids, checked on the raw value so they are reported together with every other
 * problem (a zod refinement would only run once the rest of the document is valid).
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

type ParsedDocument = z.output<typeof ClusterDocumentSchema>;
export type NodeReach = z.output<typeof ReachSchema>;
/** A node with its defaults filled: its bootstrap host and how it is reached are always known. */
export type NodeConfig = z.output<typeof NodeSchema> & { bootstrapHost: string; reach: NodeReach };
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
}

export type ParseResult = { ok: true; config: ClusterConfig } | { ok: false; problems: Problem[] };

function renderPath(path: (string | number)[]): string {
  return path.reduce<string>((out, part) => (typeof part === "number" ? `${out}[${part}]` : out ? `${out}.${part}` : part), "") || "(document)";
}

const PROTOCOLS = ["vllm", "vllm-mooncake", "sglang", "colocated"] as const;
/** Protocols that send a request to a prefill node and then (or also) to a decode node. */
export const DISAGGREGATED_PROTOCOLS: readonly Protocol[] = ["vllm", "vllm-mooncake", "sglang"];
const POLICIES = ["round_robin", "affinity", "cache_aware", "least_load"] as const;

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
  const parsed = ClusterDocumentSchema.safeParse(value);
  const duplicates = duplicateIds(value);
  if (!parsed.success || duplicates.length > 0) {
    const issues = parsed.success ? [] : parsed.error.issues.map((issue) => ({ path: renderPath(issue.path), message: issue.message }));
    return { ok: false, problems: [...issues, ...duplicates] };
  }
  const doc = parsed.data;
  const defaultProtocol = PROTOCOLS.find((p) => p === defaults.protocol) ?? "vllm";
  const defaultPolicy = POLICIES.find((p) => p === defaults.policy) ?? "affinity";
  const { reach, ...rest } = doc;
  const config: ClusterConfig = {
    ...rest,
    protocol: doc.protocol ?? defaultProtocol,
    policy: { ...doc.policy, prefill: doc.policy.prefill ?? defaultPolicy, decode: doc.policy.decode ?? defaultPolicy },
    nodes: doc.nodes.map((n) => ({ ...n, bootstrapHost: n.bootstrapHost ?? new URL(n.url).hostname, reach: n.reach ?? reach ?? {} })),
  };
  const unusable = usabilityProblems(config);
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
    problems.push({ path: "health.probeTimeoutMs", message: `must be below health.intervalMs (${h.intervalMs}), or probes overlap` });
  }
  if (config.signals.staleMs <= config.signals.intervalMs) {
    problems.push({ path: "signals.staleMs", message: `must be above signals.intervalMs (${config.signals.intervalMs}), or every reading is stale before the next poll` });
  }
  if (h.ejectMaxMs < h.ejectBaseMs) {
    problems.push({ path: "health.ejectMaxMs", message: `must be at least health.ejectBaseMs (${h.ejectBaseMs}), or the ejection backoff never grows` });
  }
  if (config.protocol === "sglang") {
    // an SGLang decode-mode server only decodes what a prefill server sent it (SPEC 8)
    config.nodes.forEach((n, i) => {
      if (n.localPrefill === true)
        problems.push({ path: `nodes[${i}].localPrefill`, message: 'must not be true under protocol "sglang": an SGLang decode node cannot prefill a request alone' });
    });
  }
  if (DISAGGREGATED_PROTOCOLS.includes(config.protocol)) {
    for (const role of ["prefill", "decode"] as const) {
      if (!config.nodes.some((n) => n.role === role || n.role === "both")) {
        problems.push({ path: "nodes", message: `protocol "${config.protocol}" needs at least one ${role}-capable node (role "${role}" or "both"); there is none` });
      }
    }
  }
  return problems;
}
