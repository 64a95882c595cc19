import { DurableObject } from "cloudflare:workers";
import { ConnectionSlots } from "../config/connection-slots";
import { slicesFor } from "../config/plan";
import { pollNodes } from "./node-fetch";
import { NodeSlices } from "./node-slices";
import type { PollerAssignment, PushAnswer, SignalReading } from "./poller-shards";

const ASSIGNMENT_KEY = "assignment";

/**
 * One slice of a large pool's /metrics polls (docs/scaling.md, "Sharded polling"): the pool's
 * object assigns it nodes; it keeps the assignment in storage and, on its own alarm, polls a slice
 * of them a sub-tick through its own six connections and pushes the compact readings to the pool's
 * object by RPC. It holds no other state: a poller that restarts polls again from its assignment,
 * and one that lost it (storage gone, alarm dropped) is assigned again by the pool's object.
 */
export class SignalPoller extends DurableObject {
  #assignment: PollerAssignment | null = null;
  readonly #slices = new NodeSlices();
  #seq = 0;
  /** when this run was due: the next is one sub-tick after it, not after the run started late */
  #due: number | null = null;

  constructor(ctx: DurableObjectState, env: unknown) {
    super(ctx, env as never);
    ctx.blockConcurrencyWhile(async () => {
      this.#assignment = (await ctx.storage.get<PollerAssignment>(ASSIGNMENT_KEY)) ?? null;
    });
  }

  /** Poll these nodes from now on; the same assignment again only makes sure the alarm is set. */
  async assign(a: PollerAssignment): Promise<void> {
    if (!sameAssignment(this.#assignment, a)) {
      this.#assignment = a;
      await this.ctx.storage.put(ASSIGNMENT_KEY, a);
    }
    if ((await this.ctx.storage.getAlarm()) === null) await this.ctx.storage.setAlarm(Date.now());
  }

  /** No nodes any more (the pool shrank or stopped sharding): no alarm, nothing kept. */
  async stop(): Promise<void> {
    this.#assignment = null;
    this.#due = null;
    await this.ctx.storage.deleteAlarm();
    await this.ctx.storage.deleteAll();
  }

  /** This sub-tick's slice of the nodes, polled six at a time, then one push to the pool's object (empty too: it says the poller lives). */
  override async alarm(): Promise<void> {
    const a = this.#assignment;
    if (!a) return;
    const started = Date.now();
    const slices = slicesFor(a.nodes.length, a.intervalMs);
    const subtick = Math.floor(a.intervalMs / slices);
    // an alarm fires a little late: scheduled from when it was due, every node keeps its period
    let next = (this.#due ?? started) + subtick;
    if (next <= started) next = started + subtick;
    this.#due = next;
    // armed first: a push that throws (the pool's object unreachable) must not end the polling
    await this.ctx.storage.setAlarm(next);
    const readings: SignalReading[] = [];
    const nodes = this.#slices.take("poll", a.nodes, slices);
    await pollNodes(this.env as unknown as Record<string, unknown>, a.timeoutMs, nodes, new ConnectionSlots(), (node, reading) => {
      readings.push({ node, reading, at: Date.now(), seq: ++this.#seq });
    });
    const pools = (this.env as Cloudflare.Env).CLUSTER_STATE;
    let answer: PushAnswer;
    try {
      answer = await pools.get(pools.idFromString(a.pool)).pushReadings({ version: a.version, poller: a.poller, readings });
    } catch (err) {
      console.warn(JSON.stringify({ event: "poller_push_failed", poller: a.poller, version: a.version, message: String(err) }));
      return;
    }
    // a poller left on a document the pool no longer holds stops; the pool assigns it again if needed
    if (answer === "stale_version" && this.#assignment?.version === a.version) await this.stop();
  }
}

function sameAssignment(a: PollerAssignment | null, b: PollerAssignment): boolean {
  if (!a || a.pool !== b.pool || a.poller !== b.poller || a.version !== b.version || a.intervalMs !== b.intervalMs || a.timeoutMs !== b.timeoutMs) return false;
  return a.nodes.length === b.nodes.length && a.nodes.every((n, i) => n.id === b.nodes[i]?.id && n.url === b.nodes[i]?.url);
}
