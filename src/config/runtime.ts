import type { Env } from "../env";
import { RouterError } from "../errors";
import type { ClusterView } from "./cluster-view";
import { ClusterConfigLoader, CONFIG_KEY, DEFAULT_CONFIG_TTL_MS, type ConfigSnapshot } from "./load";
import { withPlanLimits } from "./plan";
import { nodePools, WHOLE_CLUSTER, type NodePool } from "./pools";
import { localPrefillOf, type ClusterConfig, type NodeConfig } from "./schema";

// The Worker's view of the cluster document: one loader per isolate, one Durable Object per cluster.

const loader = new ClusterConfigLoader();
const views = new WeakMap<ClusterConfig, Map<string, ClusterView>>();

/**
 * The ClusterState object of a node pool (src/config/pools.ts); the whole cluster's by default,
 * which also keeps the document-wide state (last valid document, admin edits, refused requests).
 */
export function clusterState(env: Env, pool: string = WHOLE_CLUSTER) {
  const locationHint = stateLocationHint(env.STATE_LOCATION_HINT);
  const id = env.CLUSTER_STATE.idFromName(pool);
  return locationHint ? env.CLUSTER_STATE.get(id, { locationHint }) : env.CLUSTER_STATE.get(id);
}

/**
 * Where a new ClusterState object is created (STATE_LOCATION_HINT var): every routed request
 * waits one round trip to it, so it belongs near the engines, not wherever the first request
 * came from. Cloudflare's Durable Object location hints; a hint only applies when the object is
 * first created (developers.cloudflare.com/durable-objects/reference/data-location/).
 */
const LOCATION_HINTS = ["wnam", "enam", "sam", "weur", "eeur", "apac", "oc", "afr", "me"] as const;

export function stateLocationHint(value: string | undefined): DurableObjectLocationHint | null {
  return LOCATION_HINTS.find((h) => h === value) ?? null;
}

/** A numeric var ([vars] are strings): its value when it is a number `ok` accepts, else the default. */
export function numberVar(value: string | undefined, fallback: number, ok = (n: number) => n >= 0): number {
  const n = Number(value);
  return value !== undefined && value !== "" && Number.isFinite(n) && ok(n) ? n : fallback;
}

/** Durable Object calls a request waited for while getting the document (its log line counts them). */
export interface StateCallCount {
  calls: number;
}

/**
 * The document this isolate serves. The first read of a new valid document saves it in the
 * object, and an isolate that meets an invalid one with none of its own reads the last valid one
 * back: Durable Object calls on the response path, counted in `count` when given.
 */
export function currentConfig(env: Env, count?: StateCallCount): Promise<ConfigSnapshot> {
  const state = () => clusterState(env);
  const counted = <T>(call: () => Promise<T>): Promise<T> => {
    if (count) count.calls++;
    return call();
  };
  return loader.get({
    read: () => env.NODES.get(CONFIG_KEY),
    saveLastGood: (raw) => counted(() => state().saveLastGoodConfig(raw)),
    loadLastGood: () => counted(() => state().lastGoodConfig()),
    defaults: withPlanLimits({ protocol: env.DEFAULT_PROTOCOL, policy: env.DEFAULT_POLICY, plan: env.WORKERS_PLAN }),
    ttlMs: numberVar(env.CONFIG_TTL_MS, DEFAULT_CONFIG_TTL_MS),
    now: () => Date.now(),
    log: (event) => console.warn(JSON.stringify(event)),
  });
}

export const invalidateConfig = () => loader.invalidate();

/** Test seam: this isolate's document cache as a new isolate has it (ClusterConfigLoader.forget). */
export const forgetConfigForTests = () => loader.forget();

/** The document being served, or a 503 that says what is wrong when none was ever valid. */
export function requireConfig(snapshot: ConfigSnapshot): ClusterConfig {
  if (snapshot.config) return snapshot.config;
  const detail = snapshot.problems.map((p) => `${p.path}: ${p.message}`).join("; ");
  throw new RouterError(503, `No valid cluster document: ${detail}`, "service_unavailable", "no_valid_cluster_document");
}

/** What a pool's object needs of the document (the whole cluster's by default); one per document and pool. */
export function clusterView(config: ClusterConfig, version: string, pool: NodePool = nodePools(config)[0]!): ClusterView {
  let byPool = views.get(config);
  if (!byPool) {
    byPool = new Map();
    views.set(config, byPool);
  }
  let view = byPool.get(pool.key);
  if (!view) {
    view = {
      version: pool.key === WHOLE_CLUSTER ? version : `${version}/${pool.key}`,
      // first read by this isolate now: views are made once per parsed document
      readAt: Date.now(),
      protocol: config.protocol,
      policy: config.policy,
      health: config.health,
      signals: config.signals,
      admission: config.admission,
      ...(config.profile ? { profile: config.profile } : {}),
      nodes: pool.nodes.map((n) => ({
        id: n.id,
        url: n.url,
        role: n.role,
        group: n.group,
        weight: n.weight,
        drain: n.drain,
        models: n.models,
        reach: n.reach,
        apiKeySecret: n.apiKeySecret,
        localPrefill: localPrefillOf(n, config.protocol),
        ...(n.profile ? { profile: n.profile } : {}),
      })),
    };
    byPool.set(pool.key, view);
  }
  return view;
}

export const servesModel = (node: NodeConfig, model: string) => !node.models || node.models.includes(model);

export function maxBodyBytes(env: Env): number {
  return numberVar(env.MAX_BODY_BYTES, 10 * 1024 * 1024);
}
