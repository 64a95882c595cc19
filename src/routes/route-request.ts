import { apiKeys } from "../auth/client-access";
import { bearerToken } from "../auth/bearer";
import { keyLabel } from "../auth/digest";
import { requestTier, tierOf } from "../auth/service-tier";
import { clusterView, currentConfig, invalidateConfig, requireConfig, servesModel } from "../config/runtime";
import type { ClusterConfig } from "../config/schema";
import { cellsFor, routingUnits } from "../config/cells";
import { poolFor } from "../config/pools";
import { nodesPointingAt } from "../config/self-origin";
import type { Env } from "../env";
import { RouterError } from "../errors";
import { affinityKey, agentSessionOf, conversationKey } from "../routing/affinity-key";
import { canonicalPromptText, prefixBlockHashes, promptCharCount } from "../routing/prefix-blocks";
import type { Role } from "../routing/types";
import type { ClusterView, RouteRequest } from "../state/types";
import type { Ctx } from "./app-env";
import type { InferenceRequest, RequestKind } from "./request-schema";

const KEYED_POLICIES = new Set(["affinity", "cache_aware", "least_load"]);

/** A body made ready for the Durable Object: the document it was read under, and the request to route. */
export interface BuiltRoute {
  config: ClusterConfig;
  view: ClusterView;
  /** the object key of the pool (or of its cell) the request tries first */
  pool: string;
  /** the cells the request tries, in order (docs/scaling.md), each with its view; one: the pool itself */
  cells: RouteCell[];
  request: RouteRequest;
  keySource: string | null;
  prefixBlocks: number;
  /** Durable Object calls the request waited for while getting the document (its log line counts them) */
  configStateCalls: number;
}

/** A cell (or the pool) a request may be routed in: its object's key and the view it holds. */
export interface RouteCell {
  key: string;
  view: ClusterView;
}

/** Everything the Durable Object needs to decide, computed once in the Worker (hashing included). */
export async function buildRouteRequest(
  c: Ctx,
  kind: RequestKind,
  body: InferenceRequest,
  /** characters of the body as sent: the lease's token estimate (about 4 a token) */
  bodyChars: number,
  dryRun: boolean,
  /** one node, no disaggregation and no affinity key (embeddings, tokenizer) */
  oneHop = false,
): Promise<BuiltRoute> {
  const configCalls = { calls: 0 };
  const snapshot = await currentConfig(c.env, configCalls);
  const config = requireConfig(snapshot);
  const model = typeof body.model === "string" ? body.model : "";
  const colocated = config.protocol === "colocated" || oneHop;
  const serving = (role: Role) => config.nodes.some((n) => (!model || servesModel(n, model)) && (n.role === role || n.role === "both"));
  if (!serving("decode") || (!colocated && !serving("prefill"))) {
    throw new RouterError(404, `The model '${model}' does not exist or no node serves it.`, "not_found_error", "model_not_found", "model");
  }
  const looping = loopingNodes(config, c.req.url);
  if (looping.length) {
    throw new RouterError(508, `Node(s) ${looping.join(", ")} point at the router itself.`, "server_error", "routing_loop");
  }
  const policy = config.policy;
  // A turn that continues a stored response needs the nodes that stored it, whatever the policy.
  const pinned = kind === "responses" && typeof body.previous_response_id === "string" && body.previous_response_id !== "";
  const keyed = pinned || (!oneHop && (KEYED_POLICIES.has(policy.prefill) || KEYED_POLICIES.has(policy.decode)));
  const affinity = keyed
    ? await affinityKey({ sessionId: c.req.header("x-session-id") ?? null, agentSessionId: agentSessionOf((name) => c.req.header(name)), tenant: await tenantOf(c), body, kind })
    : null;
  const cacheAware = !oneHop && (policy.prefill === "cache_aware" || policy.decode === "cache_aware");
  // conditional and predicted disaggregation ask how much of the prompt D (and P) hold: the prefix blocks, whatever the policy
  const conditional = !colocated && (policy.disaggregation === "conditional" || policy.disaggregation === "predicted");
  // Only cache_aware and conditional need the prompt rendered as one string and hashed; the rest
  // of the policies pay for its length alone (requests are weighed by their tokens).
  const text = cacheAware || conditional ? canonicalPromptText(body, kind) : null;
  const prefixHashes = text !== null ? await prefixBlockHashes(text, policy.cacheAware.blockChars) : [];
  const promptChars = oneHop ? 0 : text !== null ? text.length : promptCharCount(body, kind);
  const key = cacheAware ? conversationKey(affinity, prefixHashes) : affinity;
  // SPEC 9: its band in the edge queue (the body's service_tier, validated by the request schema,
  // capped by the key's tier) and whose fair share it counts against
  const clientKey = c.get("clientKey");
  const tier = requestTier(tierOf(body.service_tier), clientKey?.tier ?? null);
  // the object of the pool that serves this model (one for the whole cluster unless model sets are
  // disjoint), or its cells in the order this request tries them (by its affinity key)
  const cells = cellsFor(config, poolFor(config, model), key?.hash ?? null).map((cell) => ({ key: cell.key, view: clusterView(config, snapshot.version, cell) }));
  const view = cells[0]!.view;
  return {
    config,
    view,
    pool: cells[0]!.key,
    cells,
    keySource: key?.source ?? null,
    prefixBlocks: prefixHashes.length,
    configStateCalls: configCalls.calls,
    request: {
      version: view.version,
      model,
      key: key?.hash ?? null,
      prefixHashes,
      tokens: Math.ceil(bodyChars / 4),
      promptChars,
      dryRun,
      ...(oneHop ? { oneHop } : {}),
      ...(pinned ? { pinned } : {}),
      ...(tier !== "default" ? { tier } : {}),
      ...(clientKey ? { flow: clientKey.label } : {}),
    },
  };
}

/**
 * The API key label a client-chosen affinity key is hashed with (SPEC 9). The auth middleware sets
 * it only on the routes that count keys in their finish report; /v1/responses and /v1/route derive
 * it here from the key it already checked, so a dry run names the key a real request gets.
 */
async function tenantOf(c: Ctx): Promise<string | null> {
  const label = c.get("keyLabel");
  if (label) return label;
  if (apiKeys(c.env).length === 0) return null;
  const token = bearerToken(c.req.header("authorization"));
  return token === null ? null : keyLabel(token);
}

/** Per document: node ids by origin, so the loop check costs one lookup a request. */
const nodeOrigins = new WeakMap<ClusterConfig, Map<string, string[]>>();

/** Nodes whose URL is the router's own origin (nodesPointingAt, computed once per document). */
function loopingNodes(config: ClusterConfig, requestUrl: string): string[] {
  let origins = nodeOrigins.get(config);
  if (!origins) {
    origins = new Map();
    for (const origin of new Set(config.nodes.map((n) => new URL(n.url).origin))) origins.set(origin, nodesPointingAt(config, origin));
    nodeOrigins.set(config, origins);
  }
  return origins.get(new URL(requestUrl).origin) ?? [];
}

/**
 * The request waited through a document edit and was decided under the newer version: this
 * isolate reads the document again. Its own still serves when it names the chosen nodes (KV not
 * yet showing the edit here); otherwise the lease goes back and the client may retry at once.
 */
export async function configOfVersion(env: Env, config: ClusterConfig, cell: string, version: string, chosen: string[]): Promise<ClusterConfig> {
  invalidateConfig();
  const fresh = await currentConfig(env);
  if (fresh.config && unitView(fresh.config, fresh.version, cell)?.version === version) return fresh.config;
  if (chosen.every((id) => config.nodes.some((n) => n.id === id))) return config;
  throw new RouterError(503, "The cluster document changed while the request waited; retry.", "service_unavailable", "cluster_state_unavailable", null, { "retry-after": "1" });
}

/** The view of the pool or cell named `key` under a document (null: the document has none of that name). */
export function unitView(config: ClusterConfig, version: string, key: string): ClusterView | null {
  const unit = routingUnits(config).find((u) => u.key === key);
  return unit ? clusterView(config, version, unit) : null;
}
