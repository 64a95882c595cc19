import type { ClusterConfig, NodeConfig } from "../config/schema";
import { ConnectionSlots } from "../config/connection-slots";
import { nodeAccess, nodeGet } from "../config/node-access";

/** How long one isolate reuses the union it built for a document version before asking again. */
export const MODELS_CACHE_MS = 30_000;
/** ... and when some node did not answer: soon enough to list its models once it is back. */
export const MODELS_PARTIAL_CACHE_MS = 5_000;

export interface ListModelsOptions {
  /** where node secrets and bindings (`apiKeySecret`, `reach`) are read from: the Worker's env */
  env?: Record<string, unknown>;
  timeoutMs?: number;
  now?: () => number;
  fetch?: typeof fetch;
}

// Per document (the loader hands out one config object per document version): the finished
// union and when it was built. Plain data — concurrent requests that find it missing or old each
// ask the nodes themselves rather than awaiting another request's fetches (workerd forbids that).
const cache = new WeakMap<ClusterConfig, { names: string[]; until: number }>();

/**
 * Union of the models the cluster serves: the `models` lists of the document, plus what
 * nodes without such a list report on their own /v1/models (they serve everything they load).
 * Asked with the node's bearer token, no redirects followed (a 3xx lists nothing), six at a time
 * with each timeout armed when its request is sent (src/config/connection-slots.ts), and cached for
 * MODELS_CACHE_MS per document, so clients polling /v1/models do not fan out to every node.
 */
export async function listModels(config: ClusterConfig, options: ListModelsOptions = {}): Promise<string[]> {
  const { env = {}, timeoutMs = 2_000, now = Date.now, fetch: fetcher = fetch } = options;
  const cached = cache.get(config);
  if (cached && now() < cached.until) return cached.names;

  const names = new Set<string>();
  const ask = new Map<string, NodeConfig>();
  for (const n of config.nodes) {
    if (n.models) for (const m of n.models) names.add(m);
    else if (!ask.has(n.url)) ask.set(n.url, n);
  }
  let answered = 0;
  const slots = new ConnectionSlots();
  await Promise.all(
    [...ask.values()].map(async (node) => {
      try {
        // the way every request reaches the node: its VPC binding, bearer token, Access service token
        const access = nodeAccess(env, node, (url, init) => fetcher(url, init));
        const res = await slots.send(() => nodeGet(access, node.url, "/v1/models", AbortSignal.timeout(timeoutMs)));
        if (res.status !== 200) return void (await res.body?.cancel());
        const body = (await res.json()) as { data?: Array<{ id?: unknown }> };
        for (const m of body.data ?? []) if (typeof m.id === "string") names.add(m.id);
        answered++;
      } catch {
        // an unreachable node lists nothing; its health is reported elsewhere
      }
    }),
  );
  const sorted = [...names].sort();
  cache.set(config, { names: sorted, until: now() + (answered === ask.size ? MODELS_CACHE_MS : MODELS_PARTIAL_CACHE_MS) });
  return sorted;
}
