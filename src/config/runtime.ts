import type { Env } from "../env";
import { RouterError } from "../errors";
import type { ClusterView } from "../state/types";
import { ClusterConfigLoader, CONFIG_KEY, DEFAULT_CONFIG_TTL_MS, type ConfigSnapshot } from "./load";
import type { ClusterConfig, NodeConfig } from "./schema";

// The Worker's view of the cluster document: one loader per isolate, one Durable Object per cluster.

const loader = new ClusterConfigLoader();
const views = new WeakMap<ClusterConfig, ClusterView>();

export function clusterState(env: Env) {
  return env.CLUSTER_STATE.get(env.CLUSTER_STATE.idFromName("cluster"));
}

function intVar(value: string | undefined, fallback: number): number {
  const n = Number(value);
  return value !== undefined && value !== "" && Number.isFinite(n) && n >= 0 ? n : fallback;
}

export function currentConfig(env: Env): Promise<ConfigSnapshot> {
  const state = () => clusterState(env);
  return loader.get({
    read: () => env.NODES.get(CONFIG_KEY),
    saveLastGood: (raw) => state().saveLastGoodConfig(raw),
    loadLastGood: () => state().lastGoodConfig(),
    defaults: { protocol: env.DEFAULT_PROTOCOL, policy: env.DEFAULT_POLICY },
    ttlMs: intVar(env.CONFIG_TTL_MS, DEFAULT_CONFIG_TTL_MS),
    now: () => Date.now(),
    log: (event) => console.warn(JSON.stringify(event)),
  });
}

export const invalidateConfig = () => loader.invalidate();

/** The document being served, or a 503 that says what is wrong when none was ever valid. */
export function requireConfig(snapshot: ConfigSnapshot): ClusterConfig {
  if (snapshot.config) return snapshot.config;
  const detail = snapshot.problems.map((p) => `${p.path}: ${p.message}`).join("; ");
  throw new RouterError(503, `No valid cluster document: ${detail}`, "service_unavailable", "no_valid_cluster_document");
}

export function clusterView(config: ClusterConfig, version: string): ClusterView {
  let view = views.get(config);
  if (!view) {
    view = {
      version,
      protocol: config.protocol,
      policy: config.policy,
      health: config.health,
      nodes: config.nodes.map((n) => ({ id: n.id, url: n.url, role: n.role, group: n.group, weight: n.weight, drain: n.drain, models: n.models })),
    };
    views.set(config, view);
  }
  return view;
}

export const servesModel = (node: NodeConfig, model: string) => !node.models || node.models.includes(model);

export function maxBodyBytes(env: Env): number {
  return intVar(env.MAX_BODY_BYTES, 10 * 1024 * 1024);
}
