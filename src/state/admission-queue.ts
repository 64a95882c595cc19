import { TIERS, type AdmissionSettings, type Tier } from "../config/cluster-view";

export { TIERS, type AdmissionSettings, type Tier };

/** Which band a request waits in, and whose share it counts against. */
export interface WaiterClass {
  tier: Tier;
  /** the fair-share flow: the API key's label; "" when fair share is off or there is no key */
  flow: string;
}

/** One request waiting for a decode node that is not busy. */
export interface Waiter<T> extends WaiterClass {
  /** the request's lease id: how it leaves the queue (its client left) */
  ticket: string;
  enqueuedAt: number;
  deadline: number;
  /** its flow's virtual finish time in its tier: the fair-share order (start-time fair queueing) */
  tag: number;
  /** its tier's virtual time when it arrived: its tag is one more than this or its flow's tag before it */
  floor: number;
  /** arrival order, the last tie-break */
  seq: number;
  item: T;
}

type Rank = Pick<Waiter<unknown>, "tier" | "tag" | "deadline" | "seq">;

/**
 * Whether `a` is admitted before `b` (SPEC 9): the higher tier first; within a tier the flow that
 * has been served least (its virtual finish tag), then the earliest deadline, then arrival. With
 * one flow (fair share off, or no API keys) tags rise with arrival: first come, first served.
 */
export function ranksBefore(a: Rank, b: Rank): boolean {
  const ta = TIERS.indexOf(a.tier);
  const tb = TIERS.indexOf(b.tier);
  if (ta !== tb) return ta < tb;
  if (a.tag !== b.tag) return a.tag < b.tag;
  if (a.deadline !== b.deadline) return a.deadline < b.deadline;
  return a.seq < b.seq;
}

/** Why a request joining a full queue is refused, or a waiter is pushed out by one that ranks before it. */
export type QueueRefusal =
  /** the queue is full of requests that rank before it (503 cluster_busy) */
  | "queue_full"
  /** pushed out by a request of a higher tier (503 cluster_busy) */
  | "shed"
  /** its API key holds more than its share of a full queue while other keys wait (429) */
  | "fair_share_exceeded";

export type EnqueueResult<T> = { ok: true; waiter: Waiter<T>; evicted: { waiter: Waiter<T>; reason: QueueRefusal } | null } | { ok: false; reason: QueueRefusal };

/**
 * Requests waiting at the edge, per pool (one queue per ClusterState object), kept in admission
 * order (`ranksBefore`). Holds nothing upstream: a waiter has no lease until it is admitted. Plain
 * data with the clock passed in; the object decides when capacity may have freed and offers the
 * waiters, in order, to `admit`.
 *
 * The order follows llm-d's flow control (llm-d.ai/docs/architecture/core/router/epp/flow-control:
 * "1. Priority: servicing highest priority bands first. 2. Fairness: cycling through tenants
 * within a band. 3. Ordering: ordering requests within a flow") with API keys as the tenants.
 * The cycling is start-time fair queueing (a tag a request, like Dynamo's router gives each class
 * a deficit-round-robin turn: docs.nvidia.com/dynamo, router/deficit-round-robin), so the queue
 * stays one sorted list: a waiter only ever moves up, when an earlier one of its key and tier leaves
 * unadmitted (`#giveBack`). Costs are one a request, not tokens: a share is a share of admissions.
 */
export class AdmissionQueue<T> {
  readonly #waiters: Array<Waiter<T>> = [];
  /** per tier: the tag of the last waiter admitted (the tier's virtual time) */
  readonly #clock = new Map<Tier, number>();
  /** per tier and flow: the tag of the flow's last waiter */
  readonly #lastTag = new Map<string, number>();
  #seq = 0;

  get size(): number {
    return this.#waiters.length;
  }

  /** The waiters in admission order (a copy). */
  list(): Array<Waiter<T>> {
    return [...this.#waiters];
  }

  /**
   * Where a request of this class arriving now would stand: its tag, deadline and order, without
   * joining (a newcomer's place against those waiting; `ahead`).
   */
  probe(cls: WaiterClass, now: number, s: AdmissionSettings): Omit<Waiter<T>, "item" | "ticket"> {
    const clock = this.#clock.get(cls.tier) ?? 0;
    const last = this.#lastTag.get(`${cls.tier}\u0000${cls.flow}`) ?? 0;
    return { ...cls, enqueuedAt: now, deadline: now + s.queueMs, floor: clock, tag: Math.max(clock, last) + 1, seq: this.#seq + 1 };
  }

  /** Waiters that rank before `probe` and satisfy `competes` (those a newcomer must not overtake). */
  ahead(probe: Omit<Waiter<T>, "item" | "ticket" | "enqueuedAt">, competes: (w: Waiter<T>) => boolean = () => true): number {
    let n = 0;
    for (const w of this.#waiters) {
      if (!ranksBefore(w, probe)) break;
      if (competes(w)) n++;
    }
    return n;
  }

  /**
   * Joins the queue in its place. A full queue (`maxQueued`) pushes out its last waiter when the
   * newcomer ranks before it — "shed" when the newcomer's tier is higher, "fair_share_exceeded"
   * when the last waiter's key is ahead of its share — and otherwise refuses the newcomer.
   */
  enqueue(ticket: string, item: T, cls: WaiterClass, now: number, s: AdmissionSettings): EnqueueResult<T> {
    const waiter: Waiter<T> = { ...this.probe(cls, now, s), ticket, item };
    let evicted: { waiter: Waiter<T>; reason: QueueRefusal } | null = null;
    if (this.#waiters.length >= s.maxQueued) {
      const last = this.#waiters[this.#waiters.length - 1];
      if (!last || !ranksBefore(waiter, last)) return { ok: false, reason: this.#overShare(cls, s) ? "fair_share_exceeded" : "queue_full" };
      this.#waiters.pop();
      this.#giveBack(last);
      evicted = { waiter: last, reason: last.tier === cls.tier ? "fair_share_exceeded" : "shed" };
    }
    this.#seq = waiter.seq;
    this.#lastTag.set(`${cls.tier}\u0000${cls.flow}`, waiter.tag);
    this.#waiters.splice(this.#placeOf(waiter), 0, waiter);
    return { ok: true, waiter, evicted };
  }

  /** Leaves the queue (the client left); the waiter, or null when it is not queued. */
  leave(ticket: string): Waiter<T> | null {
    const at = this.#waiters.findIndex((w) => w.ticket === ticket);
    if (at < 0) return null;
    const gone = this.#remove(at);
    this.#giveBack(gone);
    return gone;
  }

  /** Removes and returns the waiters whose time ran out. */
  expire(now: number): Array<Waiter<T>> {
    const out: Array<Waiter<T>> = [];
    for (let i = 0; i < this.#waiters.length; ) {
      if (this.#waiters[i]!.deadline <= now) out.push(this.#remove(i));
      else i++;
    }
    // the latest first: an earlier one's tag is still the one its successors were given after
    for (const gone of [...out].reverse()) this.#giveBack(gone);
    return out;
  }

  /**
   * Offers every waiter, in admission order, to `tryAdmit`; those it takes (true) leave the queue.
   * A waiter it refuses keeps its place, and later ones are still offered: they may want other
   * nodes (another model of the pool), while those wanting the same nodes are refused alike (the
   * caller's rule), so nobody overtakes a request that competes for the same capacity.
   */
  admit(tryAdmit: (w: Waiter<T>) => boolean): number {
    let admitted = 0;
    for (let i = 0; i < this.#waiters.length; ) {
      const w = this.#waiters[i]!;
      if (tryAdmit(w)) {
        // the tier's virtual time moves to the tag served: a flow that was idle starts there
        this.#clock.set(w.tier, Math.max(this.#clock.get(w.tier) ?? 0, w.tag));
        this.#remove(i);
        admitted++;
      } else i++;
    }
    return admitted;
  }

  /** The earliest deadline, or null with nobody waiting. */
  nextDeadline(): number | null {
    let next: number | null = null;
    for (const w of this.#waiters) if (next === null || w.deadline < next) next = w.deadline;
    return next;
  }

  /** Waiters now, per tier. */
  countByTier(): Record<Tier, number> {
    const counts: Record<Tier, number> = { priority: 0, default: 0, flex: 0 };
    for (const w of this.#waiters) counts[w.tier]++;
    return counts;
  }

  /** Fair share on, other keys waiting, and this key already holds at least its even share of the queue. */
  #overShare(cls: WaiterClass, s: AdmissionSettings): boolean {
    if (s.fairShare === "none") return false;
    const flows = new Set<string>([cls.flow]);
    let mine = 0;
    for (const w of this.#waiters) {
      flows.add(w.flow);
      if (w.flow === cls.flow) mine++;
    }
    return flows.size > 1 && mine > 0 && mine >= Math.max(1, Math.floor(s.maxQueued / flows.size));
  }

  /**
   * A waiter left without being admitted (timed out, pushed out, its client gone): its turn goes
   * back to its flow. The flow's later waiters in its tier take their tags again as if it had
   * never come — each one more than the later of its tier's virtual time when it arrived and the
   * tag before it — and move up to their new places. Kept, a turn no request used pushed the key's
   * later requests one further back for each: under a long overload the heaviest key's requests
   * timed out in numbers and it fell ever further behind (0.6 of its max-min share in the `tiers`
   * benchmark, the next key 1.4).
   */
  #giveBack(gone: Waiter<T>): void {
    const flow = `${gone.tier}\u0000${gone.flow}`;
    const later = this.#waiters.filter((w) => w.tier === gone.tier && w.flow === gone.flow && w.seq > gone.seq);
    const lastBefore = later.length > 0 ? later[later.length - 1]!.tag : gone.tag;
    let previous = gone.tag - 1;
    for (const w of later) {
      this.#waiters.splice(this.#waiters.indexOf(w), 1);
      w.tag = Math.max(w.floor, previous) + 1;
      previous = w.tag;
      this.#waiters.splice(this.#placeOf(w), 0, w);
    }
    if (this.#lastTag.get(flow) === lastBefore) this.#lastTag.set(flow, previous);
  }

  #placeOf(waiter: Waiter<T>): number {
    let lo = 0;
    let hi = this.#waiters.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (ranksBefore(this.#waiters[mid]!, waiter)) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }

  #remove(at: number): Waiter<T> {
    const [w] = this.#waiters.splice(at, 1);
    // nobody waits: nothing is owed to any flow, and the tags start again (bounded memory)
    if (this.#waiters.length === 0) {
      this.#clock.clear();
      this.#lastTag.clear();
    }
    return w!;
  }
}
