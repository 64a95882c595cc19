import type { ClusterConfig, NodeConfig } from "./schema";

// Nodes that serve disjoint sets of models never compete for the same request: they need no
// shared load, health or prefix state, so each such pool gets a ClusterState object of its own
// (one object is single-threaded; docs/scaling.md). A node without a `models` list serves every
// model and so joins every pool: such a cluster is one pool.

/** The object name of a cluster that is a single pool (the name it always had). */
export const WHOLE_CLUSTER = "cluster";

export interface NodePool {
  /** object name: WHOLE_CLUSTER for a single pool, else `pool:` + the pool's models */
  key: string;
  nodes: NodeConfig[];
  /** the models the pool serves; null: every model */
  models: Set<string> | null;
}

const pools = new WeakMap<ClusterConfig, NodePool[]>();

/** The document's independent pools (connected by shared models), computed once per document. */
export function nodePools(config: ClusterConfig): NodePool[] {
  const known = pools.get(config);
  if (known) return known;
  let result: NodePool[];
  if (config.nodes.some((n) => !n.models)) {
    result = [{ key: WHOLE_CLUSTER, nodes: config.nodes, models: null }];
  } else {
    // union-find over nodes, joined by each model they share
    const parent = config.nodes.map((_, i) => i);
    const find = (i: number): number => {
      let root = i;
      while (parent[root] !== root) root = parent[root]!;
      return root;
    };
    const firstWith = new Map<string, number>();
    config.nodes.forEach((n, i) => {
      for (const m of n.models ?? []) {
        const j = firstWith.get(m);
        if (j === undefined) firstWith.set(m, i);
        else parent[find(i)] = find(j);
      }
    });
    const groups = new Map<number, NodeConfig[]>();
    config.nodes.forEach((n, i) => {
      const root = find(i);
      groups.set(root, [...(groups.get(root) ?? []), n]);
    });
    const list = [...groups.values()].map((nodes) => {
      const models = new Set(nodes.flatMap((n) => n.models ?? []));
      return { key: `pool:${[...models].sort().join(",")}`, nodes, models };
    });
    result = list.length === 1 ? [{ ...list[0]!, key: WHOLE_CLUSTER }] : list;
  }
  pools.set(config, result);
  return result;
}

/** The pool that serves `model` (a request without one: the first pool). */
export function poolFor(config: ClusterConfig, model: string): NodePool {
  const all = nodePools(config);
  return (model ? all.find((p) => !p.models || p.models.has(model)) : undefined) ?? all[0]!;
}
