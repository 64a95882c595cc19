import type { ScoredCandidate } from "../routing/types";
import type { AdmissionSettings } from "../config/cluster-view";
import { AdmissionQueue } from "./admission-queue";
import { retryAfterSOf } from "./cluster-settings";
import { newHistogram, observe } from "./histogram";
import type { LeaseTable } from "./leases";
import type { ClusterSnapshot, ClusterView, RouteRequest, RouteResponse } from "./types";

/**
 * A request admitted after waiting holds its lease only this long until its Worker confirms it
 * (renew): a Worker whose handler was cancelled while it waited (its client gone) never does, so
 * no lease outlives it by more than this.
 */
export const ADMISSION_RESERVATION_MS = 5_000;
/** Seconds a request may wait at the edge: 10 ms to 10 minutes (admission.queueMs at most). */
const ADMISSION_WAIT_BOUNDS = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600];

/** A route call waiting in the queue, and how to answer it. */
interface QueuedRoute {
  req: RouteRequest;
  answer: (r: RouteResponse) => void;
}

type Refusal = "queue_full" | "timeout";

/**
 * Admission at the edge (issue 17 item 3): route calls that found every decode node busy wait
 * here, first come first served, holding nothing upstream, and are offered what frees; one
 * admitted after waiting holds its lease as a reservation until its Worker confirms it. Plain
 * data with the clock passed in: the object says when capacity may have freed (`offer`) and keeps
 * one timer for `nextWake`.
 */
export class EdgeAdmission {
  readonly #queue = new AdmissionQueue<QueuedRoute>();
  /** leases admitted from the queue and not yet confirmed by their Worker, until when */
  readonly #reservations = new Map<string, number>();
  /** how long admitted requests waited, and the requests refused by reason */
  readonly #wait = newHistogram(ADMISSION_WAIT_BOUNDS);
  readonly #rejected = new Map<Refusal, number>();

  /** requests waiting now */
  get size(): number {
    return this.#queue.size;
  }

  /** some admitted lease is not confirmed yet */
  get reserving(): boolean {
    return this.#reservations.size > 0;
  }

  /**
   * A route call found every decode node busy: it waits for one under `ticket` (its lease id), or
   * is refused at once (503 cluster_busy) when the queue is full or `queueMs` is 0.
   */
  wait(req: RouteRequest, ticket: string, now: number, s: AdmissionSettings, retryAfterS: number): Promise<RouteResponse> {
    return new Promise<RouteResponse>((answer) => {
      const waiter = s.queueMs > 0 ? this.#queue.enqueue(ticket, { req: { ...req, leaseId: ticket }, answer }, now, s) : null;
      if (!waiter) this.#refuse(answer, "queue_full", retryAfterS);
    });
  }

  /** The request's client left: out of the queue (answered client_gone, never given a lease) and no longer a reservation. */
  leave(ticket: string): void {
    this.#queue.leave(ticket)?.item.answer({ ok: false, error: { kind: "client_gone" } });
    this.#reservations.delete(ticket);
  }

  /** A dry run (/v1/route) that would wait: the picks it would get once a node frees, the decode candidates as they are now, the queue it would join. */
  wouldWait(picked: RouteResponse, busy: ScoredCandidate[]): RouteResponse {
    if (!picked.ok) return picked;
    const decision = { ...picked.decision, decode: { ...picked.decision.decode, candidates: busy } };
    return { ...picked, decision, wouldWait: { queued: this.#queue.size } };
  }

  /**
   * The lease is no longer a reservation: its Worker renewed it (still there), or it expired
   * unreleased. True when it was one (expired: its Worker never confirmed it).
   */
  unreserve(leaseId: string): boolean {
    return this.#reservations.delete(leaseId);
  }

  /**
   * Offers the waiting requests, oldest first, what the nodes can take now (`route`: selection
   * with the guard and, when admitted, the lease taken); expires those whose time ran out (503
   * cluster_busy). An admitted request's lease becomes a reservation until its Worker confirms it.
   */
  offer(now: number, cluster: ClusterView | null, leases: LeaseTable, route: (req: RouteRequest) => RouteResponse): void {
    // confirmed, released or expired: no longer a reservation to watch
    for (const [id, until] of this.#reservations) if (until <= now || !leases.get(id)) this.#reservations.delete(id);
    const retryAfterS = retryAfterSOf(cluster);
    for (const w of this.#queue.expire(now)) this.#refuse(w.item.answer, "timeout", retryAfterS);
    // Requests for the same model see the same decode nodes: once one is refused in this pass, the
    // rest are too (a pinned request depends on its own node, so it is always tried).
    const refused = new Set<string>();
    this.#queue.admit((w) => {
      const { req, answer } = w.item;
      if (!cluster || cluster.version !== req.version) {
        answer({ ok: false, error: { kind: "stale_view" } });
        return true;
      }
      const alike = req.pinned ? null : req.model;
      if (alike !== null && refused.has(alike)) return false;
      const routed = route(req);
      if (!routed.ok && routed.error.kind === "decode_busy") {
        if (alike !== null) refused.add(alike);
        return false;
      }
      const queuedMs = now - w.enqueuedAt;
      if (routed.ok && routed.leaseId) {
        const until = now + Math.min(ADMISSION_RESERVATION_MS, leases.ttlMs);
        leases.expireAt(routed.leaseId, until);
        this.#reservations.set(routed.leaseId, until);
      }
      observe(this.#wait, queuedMs);
      answer(routed.ok ? { ...routed, queuedMs } : routed);
      return true;
    });
  }

  /** When the object must look again without a call (a queue deadline, a reservation's end); null: nothing pending. */
  nextWake(): number | null {
    let at = this.#queue.nextDeadline();
    for (const until of this.#reservations.values()) if (at === null || until < at) at = until;
    return at;
  }

  /** Requests waiting now, how long the admitted ones waited, and those refused by reason (/metrics, the status page). */
  status(): ClusterSnapshot["admission"] {
    return { queued: this.#queue.size, wait: this.#wait, rejected: [...this.#rejected].map(([reason, count]) => ({ reason, count })) };
  }

  #refuse(answer: (r: RouteResponse) => void, reason: Refusal, retryAfterS: number): void {
    this.#rejected.set(reason, (this.#rejected.get(reason) ?? 0) + 1);
    answer({ ok: false, error: { kind: "cluster_busy", reason, retryAfterS } });
  }
}
