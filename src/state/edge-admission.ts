import type { ScoredCandidate } from "../routing/types";
import { ADMISSION_REFUSALS } from "../observability/cluster-snapshot";
import { AdmissionQueue, TIERS, type AdmissionSettings, type QueueRefusal, type Tier, type WaiterClass } from "./admission-queue";
import { retryAfterSOf } from "./cluster-settings";
import { newHistogram, observe } from "./histogram";
import type { LeaseTable } from "./leases";
import type { AdmissionError, ClusterSnapshot, ClusterView, RouteRequest, RouteResponse } from "./types";

/**
 * A request admitted after waiting holds its lease only this long until its Worker confirms it
 * (renew): a Worker whose handler was cancelled while it waited (its client gone) never does, so
 * no lease outlives it by more than this.
 */
export const ADMISSION_RESERVATION_MS = 5_000;
/** Seconds a request may wait at the edge: 10 ms to 10 minutes (admission.queueMs at most). */
const ADMISSION_WAIT_BOUNDS = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600];
/** The pool's recent decode-lease releases the wait estimate reads: the last minute, at most this many. */
const RELEASE_WINDOW_MS = 60_000;
const RELEASES_KEPT = 512;

/** Every reason a request is refused at the edge (the metric's `reason` label). */
export { ADMISSION_REFUSALS };
type Refusal = (typeof ADMISSION_REFUSALS)[number];

/**
 * The wait at the edge a request that must wait can expect: its place in the queue (the waiters
 * it competes with ahead of it, plus itself) over the pool's recent rate of freed decode leases,
 * measured over at least a second. null when no lease ended in the last minute: nothing to go by.
 * The SLO check adds it to the selection's own predicted TTFT of the option the request would
 * get (`sloPredictionMs`).
 */
export function predictQueuedTtftMs(ahead: number, releases: readonly number[], now: number): number | null {
  const recent = releases.filter((t) => t > now - RELEASE_WINDOW_MS);
  if (recent.length === 0) return null;
  const perMs = recent.length / Math.max(1_000, now - recent[0]!);
  return (ahead + 1) / perMs;
}

/**
 * The TTFT admission.ttftSloMs is judged on (SPEC 9): the selection's predicted TTFT of the option
 * the request gets (`routeMs`: the decision's `predictedTtftMs` under predicted disaggregation,
 * null under other policies) plus, when it must wait, the wait at the edge (`queueMs`). Null when
 * neither is known: nothing to judge by, nothing shed.
 */
export function sloPredictionMs(routeMs: number | null | undefined, queueMs: number | null): number | null {
  if (routeMs == null && queueMs === null) return null;
  return (routeMs ?? 0) + (queueMs ?? 0);
}

/** A route call waiting in the queue, and how to answer it. */
interface QueuedRoute {
  req: RouteRequest;
  answer: (r: RouteResponse) => void;
}

/** The band a request waits in and the flow it counts against (fair share off: one flow). */
export const waiterClassOf = (req: RouteRequest, s: AdmissionSettings): WaiterClass => ({
  tier: req.tier ?? "default",
  flow: s.fairShare === "none" ? "" : (req.flow ?? ""),
});

/** Requests that want the same capacity: same model, neither pinned to its own nodes. */
const competes = (a: RouteRequest, b: RouteRequest): boolean => !a.pinned && !b.pinned && a.model === b.model;

/**
 * Admission at the edge (issue 17 item 3, SPEC 8 and 9): route calls that found every decode node
 * busy wait here, in admission order (admission-queue.ts: tier, fair share across API keys,
 * deadline), holding nothing upstream, and are offered what frees; one admitted after waiting
 * holds its lease as a reservation until its Worker confirms it. Plain data with the clock passed
 * in: the object says when capacity may have freed (`offer`) and keeps one timer for `nextWake`.
 * Every waiter ends exactly once: admitted, refused (timeout, shed, fair share) or gone.
 */
export class EdgeAdmission {
  readonly #queue = new AdmissionQueue<QueuedRoute>();
  /** leases admitted from the queue and not yet confirmed by their Worker, until when */
  readonly #reservations = new Map<string, number>();
  /** how long admitted requests waited, and the requests refused by reason and tier */
  readonly #wait = newHistogram(ADMISSION_WAIT_BOUNDS);
  readonly #rejected = new Map<string, { reason: Refusal; tier: Tier; count: number }>();
  /** when the pool's decode leases ended lately (the wait estimate's rate) */
  readonly #releases: number[] = [];

  /** requests waiting now */
  get size(): number {
    return this.#queue.size;
  }

  /** some admitted lease is not confirmed yet */
  get reserving(): boolean {
    return this.#reservations.size > 0;
  }

  /**
   * First come, first served per pool (SPEC 8): a newcomer must not overtake a waiting request it
   * competes with (same model) that ranks before it, even when the nodes would take the newcomer
   * now (a smaller request, say); it joins the queue behind it instead.
   */
  waitsBehind(req: RouteRequest, now: number, s: AdmissionSettings): boolean {
    if (this.#queue.size === 0 || req.pinned) return false;
    return this.#queue.ahead(this.#queue.probe(waiterClassOf(req, s), now, s), (w) => competes(w.item.req, req)) > 0;
  }

  /**
   * A route call found every decode node busy (or must wait behind those that did): it waits for
   * one under `ticket` (its lease id), or is refused at once — 503 cluster_busy when the queue is
   * full or `queueMs` is 0, 429 fair_share_exceeded when its key holds more than its share of a
   * full queue, 503 slo_unmeetable for a `flex` request whose predicted TTFT — the wait here plus
   * `routeMs`, the selection's prediction of the option it would get once a node frees — exceeds
   * `ttftSloMs`. A request of a higher tier (or a key under its share) pushes out the last waiter
   * of a full queue.
   */
  wait(req: RouteRequest, ticket: string, now: number, s: AdmissionSettings, retryAfterS: number, routeMs: number | null = null): Promise<RouteResponse> {
    return new Promise<RouteResponse>((answer) => {
      const cls = waiterClassOf(req, s);
      if (s.queueMs <= 0) return this.#refuse(answer, "queue_full", cls.tier, retryAfterS);
      if (cls.tier === "flex" && s.ttftSloMs != null) {
        const ahead = this.#queue.ahead(this.#queue.probe(cls, now, s), (w) => competes(w.item.req, req));
        const refused = this.overSlo(req, s, sloPredictionMs(routeMs, predictQueuedTtftMs(ahead, this.#releases, now)));
        if (refused) return answer(refused);
      }
      const joined = this.#queue.enqueue(ticket, { req: { ...req, leaseId: ticket }, answer }, cls, now, s);
      if (!joined.ok) return this.#refuse(answer, joined.reason, cls.tier, retryAfterS);
      if (joined.evicted) this.#refuse(joined.evicted.waiter.item.answer, joined.evicted.reason, joined.evicted.waiter.tier, retryAfterS);
    });
  }

  /**
   * A `flex` request whose predicted TTFT (sloPredictionMs) exceeds admission.ttftSloMs: its
   * refusal, 503 slo_unmeetable at once, counted; null for any other.
   */
  overSlo(req: RouteRequest, s: AdmissionSettings, predictedMs: number | null): RouteResponse | null {
    const tier = waiterClassOf(req, s).tier;
    if (tier !== "flex" || s.ttftSloMs == null || predictedMs === null || !(predictedMs > s.ttftSloMs)) return null;
    let refused: RouteResponse | null = null;
    this.#refuse((r) => (refused = r), "slo_unmeetable", tier, Math.max(1, Math.ceil(predictedMs / 1000)), predictedMs);
    return refused;
  }

  /** The request's client left: out of the queue (answered client_gone, never given a lease) and no longer a reservation. */
  leave(ticket: string): void {
    this.#queue.leave(ticket)?.item.answer({ ok: false, error: { kind: "client_gone" } });
    this.#reservations.delete(ticket);
  }

  /** A decode lease of the pool ended: capacity freed (the rate the wait estimate reads). */
  released(now: number): void {
    this.#releases.push(now);
    while (this.#releases.length > RELEASES_KEPT || (this.#releases[0] ?? now) <= now - RELEASE_WINDOW_MS) this.#releases.shift();
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
   * Offers the waiting requests, in admission order, what the nodes can take now (`route`:
   * selection with the guard and, when admitted, the lease taken); expires those whose time ran
   * out (503 cluster_busy). An admitted request's lease becomes a reservation until its Worker
   * confirms it.
   */
  offer(now: number, cluster: ClusterView | null, leases: LeaseTable, route: (req: RouteRequest) => RouteResponse, retryAfterS = retryAfterSOf(cluster)): void {
    // confirmed, released or expired: no longer a reservation to watch
    for (const [id, until] of this.#reservations) if (until <= now || !leases.get(id)) this.#reservations.delete(id);
    for (const w of this.#queue.expire(now)) this.#refuse(w.item.answer, "timeout", w.tier, retryAfterS);
    // Requests for the same model see the same decode nodes: once one is refused in this pass, the
    // rest are too (a pinned request depends on its own node, so it is always tried).
    const refused = new Set<string>();
    this.#queue.admit((w) => {
      const { req, answer } = w.item;
      if (!cluster) {
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
      // decided under the document in force, whichever the request came with (an edit while it
      // waited: an operator adding a D to relieve the pool); its Worker reloads that version
      const edited = cluster.version !== req.version ? { version: cluster.version } : {};
      answer(routed.ok ? { ...routed, queuedMs, ...edited } : routed);
      return true;
    });
  }

  /** When the object must look again without a call (a queue deadline, a reservation's end); null: nothing pending. */
  nextWake(): number | null {
    let at = this.#queue.nextDeadline();
    for (const until of this.#reservations.values()) if (at === null || until < at) at = until;
    return at;
  }

  /** Requests waiting now (in all and per tier), how long the admitted ones waited, and those refused by reason and tier (/metrics, the status page). */
  status(): ClusterSnapshot["admission"] {
    const byTier = this.#queue.countByTier();
    return {
      queued: this.#queue.size,
      queuedByTier: TIERS.map((tier) => ({ tier, count: byTier[tier] })),
      wait: this.#wait,
      rejected: [...this.#rejected.values()].map((r) => ({ ...r })),
    };
  }

  #refuse(answer: (r: RouteResponse) => void, reason: Refusal | QueueRefusal, tier: Tier, retryAfterS: number, predictedMs = 0): void {
    const key = `${reason}/${tier}`;
    const counted = this.#rejected.get(key) ?? { reason, tier, count: 0 };
    counted.count++;
    this.#rejected.set(key, counted);
    answer({ ok: false, error: admissionError(reason, retryAfterS, predictedMs) });
  }
}

function admissionError(reason: Refusal, retryAfterS: number, predictedMs: number): AdmissionError {
  switch (reason) {
    case "fair_share_exceeded":
      return { kind: "fair_share_exceeded", retryAfterS };
    case "slo_unmeetable":
      return { kind: "slo_unmeetable", predictedMs: Math.round(predictedMs), retryAfterS };
    case "queue_full":
    case "timeout":
    case "shed":
      return { kind: "cluster_busy", reason, retryAfterS };
  }
}
