import type { AdmissionSettings } from "../config/cluster-view";

/** One request waiting for a decode node that is not busy. */
export interface Waiter<T> {
  /** the request's lease id: how it leaves the queue (its client left) */
  ticket: string;
  enqueuedAt: number;
  deadline: number;
  item: T;
}

/**
 * Requests waiting at the edge, first come first served, per pool (one queue per ClusterState
 * object). Holds nothing upstream: a waiter has no lease until it is admitted. Plain data with the
 * clock passed in; the object decides when capacity may have freed and offers the waiters, oldest
 * first, to `admit`.
 */
export class AdmissionQueue<T> {
  readonly #waiters: Array<Waiter<T>> = [];

  get size(): number {
    return this.#waiters.length;
  }

  /** Joins the queue; false when it is full (`maxQueued`: the request is answered 503 at once). */
  enqueue(ticket: string, item: T, now: number, s: AdmissionSettings): Waiter<T> | null {
    if (this.#waiters.length >= s.maxQueued) return null;
    const waiter = { ticket, enqueuedAt: now, deadline: now + s.queueMs, item };
    this.#waiters.push(waiter);
    return waiter;
  }

  /** Leaves the queue (the client left); the waiter, or null when it is not queued. */
  leave(ticket: string): Waiter<T> | null {
    const at = this.#waiters.findIndex((w) => w.ticket === ticket);
    return at < 0 ? null : (this.#waiters.splice(at, 1)[0] ?? null);
  }

  /** Removes and returns the waiters whose time ran out. */
  expire(now: number): Array<Waiter<T>> {
    const out: Array<Waiter<T>> = [];
    for (let i = 0; i < this.#waiters.length; ) {
      const w = this.#waiters[i]!;
      if (w.deadline <= now) {
        out.push(w);
        this.#waiters.splice(i, 1);
      } else i++;
    }
    return out;
  }

  /**
   * Offers every waiter, in arrival order, to `tryAdmit`; those it takes (true) leave the queue.
   * A waiter it refuses keeps its place, and later ones are still offered: they may want other
   * nodes (another model of the pool), while those wanting the same nodes are refused alike, so
   * nobody overtakes a request that competes for the same capacity.
   */
  admit(tryAdmit: (w: Waiter<T>) => boolean): number {
    let admitted = 0;
    for (let i = 0; i < this.#waiters.length; ) {
      if (tryAdmit(this.#waiters[i]!)) {
        this.#waiters.splice(i, 1);
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
}
