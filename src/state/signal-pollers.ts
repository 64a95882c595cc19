import { pollerCount } from "../config/plan";
import type { EngineReading } from "./engine-metrics";
import { signalsOf, pollTimeoutMsOf } from "./cluster-settings";
import { assignPollers, NewestReadings, pollerName, PollerWatch, type PushAnswer, type ReadingsPush } from "./poller-shards";
import type { ClusterSnapshot, ClusterView } from "./types";

type PollerNamespace = Cloudflare.Env["SIGNAL_POLLER"];

/**
 * The pool object's side of sharded polling (docs/scaling.md): assigns its pollers, takes their
 * pushes, and watches for a silent one. `pool` is the object's id; `namespace` the SIGNAL_POLLER
 * binding (undefined when wrangler.toml lacks it).
 */
export class SignalPollers {
  readonly #watch = new PollerWatch();
  readonly #newest = new NewestReadings();

  constructor(
    readonly pool: string,
    readonly namespace: () => PollerNamespace | undefined,
  ) {}

  /** How many pollers poll this document's pool: 0 while the pool's object polls itself. */
  count(cluster: ClusterView): number {
    return pollerCount(cluster.nodes.length, signalsOf(cluster));
  }

  /**
   * A poller's push: taken when for the document in force; each reading given to `polled` (its
   * `at` never later than now) when newer than the node's newest.
   */
  take(push: ReadingsPush, cluster: ClusterView | null, now: number, polled: (node: string, reading: EngineReading | null, at: number) => void): PushAnswer {
    if (!cluster || cluster.version !== push.version) return "stale_version";
    this.#watch.heard(push.poller, push.version, now);
    for (const r of push.readings) if (this.#newest.take(r)) polled(r.node, r.reading, Math.min(r.at, now));
    return "ok";
  }

  /**
   * Each poller is assigned its rendezvous share of the nodes when this document is new to it,
   * and again when it has not pushed for 3 intervals (a Durable Object restarts on its next call,
   * and `assign` re-arms a lost alarm); pollers past the count are stopped.
   */
  async supervise(cluster: ClusterView, now: number): Promise<void> {
    const s = signalsOf(cluster);
    const count = this.count(cluster);
    const stopped = this.#watch.trim(count);
    const due = this.#watch.due(count, cluster.version, now, s.intervalMs);
    if (due.length === 0 && stopped.length === 0) return;
    const ns = this.namespace();
    if (!ns) {
      // a wrangler.toml without the binding (docs/deploy.md): no node of this pool gets a reading
      console.error(JSON.stringify({ event: "signal_poller_unbound", nodes: cluster.nodes.length, message: "sharded, but SIGNAL_POLLER is unbound: no polls" }));
      for (const i of due) this.#watch.assigned(i, cluster.version, now);
      return;
    }
    const poller = (i: number) => ns.get(ns.idFromName(pollerName(this.pool, i)));
    const shards = assignPollers(cluster.nodes, count);
    const known = new Map(this.#watch.lastHeard().map((p) => [p.poller, p]));
    const calls = due.map((i) => {
      const last = known.get(i);
      if (last?.version === cluster.version) console.warn(JSON.stringify({ event: "signal_poller_silent", poller: i, silentMs: now - last.heard }));
      this.#watch.assigned(i, cluster.version, now);
      const nodes = (shards[i] ?? []).map(({ id, url, reach, apiKeySecret }) => ({ id, url, reach, apiKeySecret }));
      return poller(i).assign({ pool: this.pool, poller: i, version: cluster.version, nodes, intervalMs: s.intervalMs, timeoutMs: pollTimeoutMsOf(cluster) });
    });
    const results = await Promise.allSettled([...calls, ...stopped.map((i) => poller(i).stop())]);
    for (const r of results) if (r.status === "rejected") console.warn(JSON.stringify({ event: "signal_poller_call_failed", message: String(r.reason) }));
  }

  /** Each poller, its nodes, and how long since it pushed (or was assigned); undefined while not sharded. */
  status(cluster: ClusterView | null, now: number): ClusterSnapshot["pollers"] {
    const count = cluster ? this.count(cluster) : 0;
    if (!cluster || count === 0) return undefined;
    const heard = new Map(this.#watch.lastHeard().map((p) => [p.poller, p.heard]));
    return assignPollers(cluster.nodes, count).map((shard, poller) => ({ poller, nodes: shard.length, silentMs: Math.max(0, now - (heard.get(poller) ?? now)) }));
  }

  forget(node: string): void {
    this.#newest.forget(node);
  }

  clear(): void {
    this.#watch.clear();
    this.#newest.clear();
  }
}
