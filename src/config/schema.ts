import { z } from "zod";

// The cluster document (SPEC section 2). Parsed once at the edge; the rest of the
// code receives a typed, defaults-filled ClusterConfig.

const positiveInt = z.number().int().positive();
const timeoutMs = positiveInt.max(600_000, "must be at most 600000 (10 minutes)");

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

export const NodeSchema = z
  .object({
    id: z.string().regex(/^[A-Za-z0-9._-]{1,64}$/, "must match [A-Za-z0-9._-]{1,64}"),
    url: nodeUrl,
    role: z.enum(["prefill", "decode", "both"]),
    group: z.string().min(1).max(128).optional(),
    weight: z.number().positive().finite().default(1),
    models: z.array(z.string().min(1)).optional(),
    bootstrapPort: positiveInt.max(65535).default(8998),
    drain: z.boolean().default(false),
    apiKeySecret: z.string().regex(/^[A-Za-z_][A-Za-z0-9_]{0,127}$/, "must be a secret name").optional(),
  })
  .strict();

const PolicySchema = z
  .object({
    prefill: z.enum(["round_robin", "affinity", "cache_aware", "least_load"]).optional(),
    decode: z.enum(["round_robin", "affinity", "cache_aware", "least_load"]).optional(),
    pdGroup: z.enum(["off", "prefer", "strict"]).default("off"),
    pdGroupBonus: z.number().min(0).max(10).default(0.3),
    loadFactor: z.number().min(1).max(100).default(1.25),
    cacheAware: z
      .object({
        blockChars: positiveInt.min(64).max(65536).default(2048),
        loadFactor: z.number().min(1).max(100).default(3),
        shareFactor: z.number().min(1).max(100).default(1.1),
        shareHalfLife: positiveInt.max(1_000_000).default(1000),
      })
      .strict()
      .default({}),
  })
  .strict();

const TimeoutsSchema = z
  .object({ prefillMs: timeoutMs.default(120_000), decodeFirstByteMs: timeoutMs.default(120_000) })
  .strict();

const HealthSchema = z
  .object({
    intervalMs: positiveInt.default(10_000),
    probeTimeoutMs: positiveInt.default(2_000),
    downAfter: positiveInt.default(2),
    upAfter: positiveInt.default(2),
    ejectAfter: positiveInt.default(3),
    ejectBaseMs: positiveInt.default(10_000),
    ejectMaxMs: positiveInt.default(300_000),
  })
  .strict();

export const ClusterDocumentSchema = z
  .object({
    protocol: z.enum(["vllm", "sglang", "colocated"]).optional(),
    policy: PolicySchema.default({}),
    timeouts: TimeoutsSchema.default({}),
    health: HealthSchema.default({}),
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
export type NodeConfig = z.output<typeof NodeSchema>;
export type Protocol = "vllm" | "sglang" | "colocated";
export type ClusterConfig = Omit<ParsedDocument, "protocol" | "policy"> & {
  protocol: Protocol;
  policy: Required<ParsedDocument["policy"]>;
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

const PROTOCOLS = ["vllm", "sglang", "colocated"] as const;
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
  return {
    ok: true,
    config: {
      ...doc,
      protocol: doc.protocol ?? defaultProtocol,
      policy: { ...doc.policy, prefill: doc.policy.prefill ?? defaultPolicy, decode: doc.policy.decode ?? defaultPolicy },
    },
  };
}
