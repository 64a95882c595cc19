import { rendezvousUnit } from "../routing/hash";
import { cellProblems, routingUnits } from "./cells";
import type { SignalSettings } from "./cluster-view";
import { type ClusterConfig, type ConfigDefaults, DEFAULT_NODES_PER_POLLER, DEFAULT_SHARD_ABOVE, type Problem } from "./schema";

// What one invocation of the router may send, and what a cluster document makes it send.
// Cloudflare counts subrequests per invocation: Workers Free 50 external ones, Workers Paid 10,000
// by default (raised or lowered with `[limits] subrequests` in wrangler.toml)
// (developers.cloudflare.com/workers/platform/limits/#subrequests). A Durable Object's alarm run is
// taken as an invocation of its own (docs/deploy.md, section 8, says how sure that is). The plan is
// named by the WORKERS_PLAN var.

/** A sub-tick is at least this long: spreading finer gains nothing and costs an alarm run each. */
export const MIN_SUBTICK_MS = 1_000;
/** A job over more nodes than this is split into slices, one a sub-tick: two rounds of the six connection slots. */
export const SLICE_NODES = 12;

/**
 * How many slices (one a sub-tick) a job over `nodes` nodes with period `periodMs` is spread into,
 * so its fetches do not leave in one burst and each alarm run sends a bounded number.
 */
export function slicesFor(nodes: number, periodMs: number): number {
  return Math.max(1, Math.min(Math.ceil(nodes / SLICE_NODES), Math.floor(periodMs / MIN_SUBTICK_MS)));
}

/** Subrequests an invocation may send per WORKERS_PLAN value; a number is a `[limits] subrequests` setting. */
const PLANS: Record<string, { limit: number; name: string }> = {
  free: { limit: 50, name: "the Workers Free plan" },
  paid: { limit: 10_000, name: "the Workers Paid plan's default" },
};

/** The plan a WORKERS_PLAN value names (unset: paid), or null when it names none. */
export function planOf(value: string | undefined): { limit: number; name: string } | null {
  if (value === undefined || value === "") return PLANS.paid!;
  const known = PLANS[value.toLowerCase()];
  if (known) return known;
  const n = Number(value);
  return Number.isInteger(n) && n > 0 ? { limit: n, name: `[limits] subrequests = ${n}` } : null;
}

/** How many poller objects poll a pool of `nodes` nodes (docs/scaling.md, "Sharded polling"): 0 while its own object covers them. */
export function pollerCount(nodes: number, s: Pick<SignalSettings, "shardAbove" | "nodesPerPoller">): number {
  if (nodes <= (s.shardAbove ?? DEFAULT_SHARD_ABOVE)) return 0;
  return Math.ceil(nodes / (s.nodesPerPoller ?? DEFAULT_NODES_PER_POLLER));
}

/**
 * Each node to the poller with the highest rendezvous score of (node id, poller index): adding or
 * removing a node moves only that node, and adding a poller moves about 1/k of the nodes, all to it.
 */
export function assignPollers<T extends { id: string }>(nodes: readonly T[], count: number): T[][] {
  const shards: T[][] = Array.from({ length: count }, () => []);
  for (const node of nodes) {
    let best = 0;
    let bestScore = -1;
    for (let i = 0; i < count; i++) {
      const score = rendezvousUnit(node.id, `poller:${i}`);
      if (score > bestScore) {
        bestScore = score;
        best = i;
      }
    }
    shards[best]?.push(node);
  }
  return shards;
}

/**
 * The most subrequests one run of a pool's alarm sends: a probe slice and a poll slice due
 * together; sharded, a call to each poller instead of the poll slice (and a poller's own run
 * sends a slice of its share, fewer than the pool's).
 */
export function alarmSubrequests(nodes: number, c: Pick<ClusterConfig, "health" | "signals">): number {
  const slice = (period: number) => Math.ceil(nodes / slicesFor(nodes, period));
  const pollers = pollerCount(nodes, c.signals);
  return slice(c.health.intervalMs) + (pollers > 0 ? pollers : slice(c.signals.intervalMs));
}

/**
 * The most subrequests one run of a poller's alarm sends (src/state/signal-poller.ts): a slice of
 * its share of the nodes' /metrics polls and one push of the readings to the pool's object (a
 * Durable Object call, counted as a subrequest to be safe). 0 while the pool is not sharded. The
 * shares follow the same rendezvous split the pool's object uses, so the largest is the one named.
 */
export function pollerRunSubrequests(nodes: readonly { id: string }[], c: Pick<ClusterConfig, "signals">): number {
  const count = pollerCount(nodes.length, c.signals);
  if (count === 0) return 0;
  const largest = Math.max(...assignPollers(nodes, count).map((shard) => shard.length));
  return Math.ceil(largest / slicesFor(largest, c.signals.intervalMs)) + 1;
}

/** Nodes one GET /v1/models asks (each URL once): those without a `models` list. */
export function modelsSubrequests(config: Pick<ClusterConfig, "nodes">): number {
  return new Set(config.nodes.filter((n) => !n.models).map((n) => n.url)).size;
}

/** The document needs more subrequests in one invocation than the plan allows: each way, named. */
export function planProblems(config: ClusterConfig, planVar: string | undefined): Problem[] {
  const plan = planOf(planVar);
  if (!plan) return [{ path: "(WORKERS_PLAN)", message: `the WORKERS_PLAN var must be "free", "paid" or the [limits] subrequests number, not "${planVar}"` }];
  const problems: Problem[] = [];
  const allows = `more than ${plan.name} allows in one invocation (${plan.limit}; WORKERS_PLAN var, docs/deploy.md section 8)`;
  // each pool's object, or each cell's: the alarm of each covers its own nodes
  for (const pool of routingUnits(config)) {
    const need = alarmSubrequests(pool.nodes.length, config);
    if (need <= plan.limit) continue;
    problems.push({
      path: "nodes",
      message:
        `${pool.nodes.length} nodes in one pool make its alarm send up to ${need} subrequests a run (a slice of the probes, and a slice of the /metrics polls or, sharded, a call to each poller object), ${allows}: ` +
        "lengthen health.intervalMs and signals.intervalMs (a longer period spreads the nodes over more one-second sub-ticks), split the nodes into pools by model, or use a plan that allows more",
    });
  }
  for (const pool of routingUnits(config)) {
    const need = pollerRunSubrequests(pool.nodes, config);
    if (need <= plan.limit) continue;
    problems.push({
      path: "signals.nodesPerPoller",
      message:
        `each poller object of a pool of ${pool.nodes.length} nodes would send up to ${need} subrequests a run (a slice of its share of the /metrics polls and one push to the pool's object), ${allows}: ` +
        "lower signals.nodesPerPoller (more pollers, fewer nodes each) or lengthen signals.intervalMs",
    });
  }
  const asks = modelsSubrequests(config);
  if (asks > plan.limit) {
    problems.push({
      path: "nodes",
      message: `GET /v1/models would ask ${asks} nodes (those without a "models" list) in one request, ${allows}: give the nodes a "models" list, or use a plan that allows more`,
    });
  }
  return problems;
}

/** The document defaults with the checks that need its pools added: the cells' roles and the plan's subrequests (schema.ts calls it; see ConfigDefaults.limits). */
export function withPlanLimits(defaults: ConfigDefaults): ConfigDefaults {
  return { ...defaults, limits: (config) => [...cellProblems(config), ...planProblems(config, defaults.plan)] };
}
