import type { Decision, PdMode, PdReason, Role } from "../routing/types";
import type { EngineUsage } from "../state/cache-feedback";
import type { ClusterView, FinishReport, LegReport, RequestObservation, RouteRequest, RouteResponse } from "../state/types";
import { logRequest, type RequestLog } from "../observability/log";
import type { TraceContext } from "../observability/trace";

/** The Durable Object's RPC methods one request uses (the stub, or a fake in unit tests). */
export interface LeaseState {
  route(req: RouteRequest): Promise<RouteResponse>;
  renew(leaseId: string): Promise<unknown>;
  prefillDone(leaseId: string, report: LegReport): Promise<unknown>;
  failover(leaseId: string, role: Role, report: LegReport, wantNext: boolean): Promise<{ next: string | null; prefill?: string }>;
  finish(leaseId: string, report: FinishReport): Promise<unknown>;
  /** a newer document than the object holds, from a request waiting at the edge */
  syncView(view: ClusterView): Promise<unknown>;
}

/** How often a request waiting at the edge looks for an edited document (its isolate's cached read) */
export const WAITING_REFRESH_MS = 1000;

/** How the request ended; `status` is what the client got (499: it left first). */
export interface Ending {
  status: number;
  outcome: "ok" | "error" | "aborted" | "stalled";
  error?: string | undefined;
  legs?: { prefill?: LegReport; decode?: LegReport };
}

export interface LifeOptions {
  state: LeaseState;
  waitUntil(promise: Promise<unknown>): void;
  requestId: string;
  /** the route's canonical path: metric label and upstream path */
  route: string;
  model: string;
  policy: string;
  keyHash: string | null;
  keySource: string | null;
  keyLabel?: string | undefined;
  trace: TraceContext;
  /** the client's signal (may never fire for a client that left before the response began) */
  clientSignal: AbortSignal;
  /** a live request renews its lease this often; the lease expires without it */
  renewMs: number;
  /** P's good answer waits this long to travel with the finish report (PREFILL_REPORT_DELAY_MS var) */
  prefillReportDelayMs: number;
}

let sequence = 0;

/** How long P's good answer may wait to travel with the finish report (see prefillDone). */
export const PREFILL_REPORT_DELAY_MS = 250;

/**
 * One routed request from its lease to its log line. Everything it owns — the lease (renewed
 * while the request lives), the abort signal of its legs, the P leg still reading, the log line
 * and the finish report — ends in `end()`, which runs exactly once whichever path gets there
 * first: success, error, timeout, the client gone, or the client no longer reading.
 */
export class RequestLife {
  readonly #leaseId = crypto.randomUUID();
  readonly #started = Date.now();
  /** aborted when the request ends or the client leaves: every leg listens to it */
  readonly #controller = new AbortController();
  readonly chosen = { prefill: "", decode: "" };
  decision: Decision | null = null;
  /** how it is served and why (SPEC 8 route receipts); null until routed */
  mode: PdMode | null = null;
  reason: PdReason | null = null;
  /** D prefills alone (conditional disaggregation): P and D name the same node, whichever D serves */
  #localPrefill = false;
  /** it was a local prefill whose D failed: now P then D (its uncached-token prediction was the first D's) */
  #localFailedOver = false;
  /** the usage of the engine that prefilled, read when the finish report is made (P's may arrive late) */
  #engineUsage: (() => EngineUsage | null) | null = null;
  failOpen: Role[] = [];
  /** queueMs: time the route call waited at the edge for a decode node that is not busy */
  readonly timings: { routeMs?: number; queueMs?: number; prefillMs?: number; decodeMs?: number } = {};
  /** Durable Object calls made, and how many of them the response waited for */
  #stateCalls = 0;
  /** the calls awaited (route, failover): a call sent in the background costs the response nothing */
  #awaitedCalls = 0;
  #stateCallsBeforeResponse: number | null = null;
  #ended = false;
  #heartbeat: ReturnType<typeof setInterval> | undefined;
  /** P's part of the lease has been reported (P answered, failed, or there is no P) */
  prefillReported = false;
  /** P's good answer, not yet reported: it travels with the finish report when that comes soon */
  #deferredPrefill: LegReport | null = null;
  #prefillTimer: ReturnType<typeof setTimeout> | undefined;
  /** sglang: P's answer is still being read; the request waits for it before it reports */
  #pendingPrefill: Promise<LegReport | null> | null = null;
  /** a key (hash) under which the state remembers this request's P and D (a stored response's id) */
  #rememberKey: Promise<string | null> | null = null;
  /** called when the request ends before a D used P's KV handle (vllm: release P's blocks) */
  readonly #onUnusedHandle: Array<() => Promise<unknown>> = [];
  /** whether P's answer carried prompt_tokens_details (observability/usage-details.ts) */
  #usageDetails: { node: string; reported: boolean } | null = null;
  /** what was measured of the answer (TTFT, the stream's pace): the node rates learn from it */
  #observed: RequestObservation | null = null;

  readonly #o: LifeOptions;

  constructor(o: LifeOptions) {
    this.#o = o;
    const onClientAbort = () => this.end({ status: 499, outcome: "aborted", error: "client disconnected", legs: this.#abortedLegs() });
    if (o.clientSignal.aborted) queueMicrotask(onClientAbort);
    else o.clientSignal.addEventListener("abort", onClientAbort, { once: true });
  }

  get signal(): AbortSignal {
    return this.#controller.signal;
  }

  get isEnded(): boolean {
    return this.#ended;
  }

  /** A request id unique to this request and attempt: engines must never see two in flight with one id. */
  upstreamId(): string {
    return `${this.#o.requestId.slice(0, 64)}-${this.#leaseId.slice(0, 8)}${(sequence++ % 1296).toString(36)}`;
  }

  get trace(): TraceContext {
    return this.#o.trace;
  }

  #call<T>(p: Promise<T>): Promise<T> {
    this.#stateCalls++;
    return p;
  }

  #awaited<T>(p: Promise<T>): Promise<T> {
    this.#awaitedCalls++;
    return this.#call(p);
  }

  async #whileWaiting<T>(call: Promise<T>, version: string, refresh?: () => Promise<ClusterView | null>): Promise<T> {
    if (!refresh) return call;
    let known = version;
    const timer = setInterval(() => {
      void refresh()
        .then((next) => {
          if (!next || next.version === known || this.#ended) return;
          known = next.version;
          this.#o.waitUntil(this.#call(this.#o.state.syncView(next)));
        })
        .catch(() => undefined);
    }, WAITING_REFRESH_MS);
    try {
      return await call;
    } finally {
      clearInterval(timer);
    }
  }

  /** Durable Object calls the request waited for before it was routed (the document: see currentConfig). */
  waitedForState(calls: number): void {
    this.#stateCalls += calls;
    this.#awaitedCalls += calls;
  }

  /**
   * Picks P and D and takes the lease: the one round trip the response waits for. While the call
   * waits at the edge (every D busy), `refresh` is asked for the document every WAITING_REFRESH_MS
   * and an edited one is handed to the object, which decides the waiters again under it.
   */
  async route(request: RouteRequest, view: ClusterView, refresh?: () => Promise<ClusterView | null>): Promise<RouteResponse> {
    request = { ...request, leaseId: this.#leaseId, requestId: this.#o.requestId };
    let routed = await this.#awaited(this.#whileWaiting(this.#o.state.route(request), view.version, refresh));
    // The object has another version of the document (new, or evicted): send it once.
    if (!routed.ok && routed.error.kind === "stale_view")
      routed = await this.#awaited(this.#whileWaiting(this.#o.state.route({ ...request, cluster: view }), view.version, refresh));
    this.timings.routeMs = Date.now() - this.#started;
    if (routed.ok && routed.queuedMs !== undefined) {
      this.timings.queueMs = routed.queuedMs;
      // Admitted after waiting: the lease is a reservation until this confirms the request is
      // still here (a handler cancelled while it waited never does; src/state/edge-admission.ts).
      if (!this.#ended) this.#o.waitUntil(this.#call(this.#o.state.renew(this.#leaseId)));
    }
    if (!routed.ok) return routed;
    // The client left during the call: end() has sent finish, which releases the lease (or, had
    // it overtaken the call, left a tombstone so the lease was never taken).
    if (this.#ended) return routed;
    this.decision = routed.decision;
    this.chosen.prefill = routed.decision.prefill.id;
    this.chosen.decode = routed.decision.decode.id;
    this.mode = routed.decision.mode;
    this.reason = routed.decision.reason;
    this.#localPrefill = routed.decision.prefill.rule === "local_prefill";
    this.failOpen = (["prefill", "decode"] as const).filter((r) => routed.decision[r].failOpen);
    this.#heartbeat = setInterval(() => this.#o.waitUntil(this.#call(this.#o.state.renew(this.#leaseId))), this.#o.renewMs);
    return routed;
  }

  /**
   * P answered (or gave up): its part of the lease ends, off the response path. A good answer's
   * report waits up to PREFILL_REPORT_DELAY_MS to travel with the finish report (one state call
   * instead of two for a short request); P's in-flight count lags by at most that much.
   */
  prefillDone(report: LegReport): void {
    this.prefillReported = true;
    if (report.outcome !== "ok") {
      this.#o.waitUntil(this.#call(this.#o.state.prefillDone(this.#leaseId, report)));
      return;
    }
    if (report.ms !== undefined) this.timings.prefillMs = report.ms;
    this.#deferredPrefill = report;
    clearTimeout(this.#prefillTimer);
    this.#prefillTimer = setTimeout(() => {
      const deferred = this.#takeDeferredPrefill();
      if (deferred) this.#o.waitUntil(this.#call(this.#o.state.prefillDone(this.#leaseId, deferred)));
    }, this.#o.prefillReportDelayMs);
  }

  #takeDeferredPrefill(): LegReport | null {
    const report = this.#deferredPrefill;
    this.#deferredPrefill = null;
    clearTimeout(this.#prefillTimer);
    return report;
  }

  /** Records a failed leg and asks for the next node of its role (null: none). Awaited: a retry needs it. */
  async failover(role: Role, report: LegReport, wantNext: boolean): Promise<string | null> {
    const { next, prefill } = await this.#awaited(this.#o.state.failover(this.#leaseId, role, report, wantNext));
    if (next) this.chosen[role] = next;
    if (next && role === "decode" && this.#localPrefill) {
      // a local prefill whose D failed goes P then D (the object moved the lease's prefill part to P);
      // with no P to go through, it moves with its D
      this.chosen.prefill = prefill ?? next;
      if (prefill) {
        this.#localPrefill = false;
        this.mode = "disaggregated";
        this.reason = "no_local_prefill";
        this.#localFailedOver = true;
      }
    }
    return next;
  }

  /** sglang: P's answer still being read when D's is returned. */
  awaitPrefill(settled: Promise<LegReport | null>): void {
    this.#pendingPrefill = settled;
  }

  /** The next request that presents this key (hash) should reach the same P and D. */
  rememberAs(key: Promise<string | null>): void {
    this.#rememberKey = key.catch(() => null);
  }

  /** D prefills alone: the protocol to run is D's alone, with no P leg. */
  get isLocalPrefill(): boolean {
    return this.#localPrefill;
  }

  /**
   * The usage of the engine that prefilled (cache-hit feedback), read when the finish report is
   * made: it travels with it, no state call of its own.
   */
  reportEngineUsage(usage: () => EngineUsage | null): void {
    this.#engineUsage = usage;
  }

  /** P answered with (or without) prompt_tokens_details; reported with the finish. */
  noteUsageDetails(node: string, reported: boolean | null): void {
    if (reported !== null) this.#usageDetails = { node, reported };
  }

  /** Measurements of the answer, sent with the finish report (no state call of its own). */
  observe(o: RequestObservation): void {
    this.#observed = { ...this.#observed, ...o };
  }

  /** A KV handle D has not (yet) been given: released if the request ends before it is. */
  holdHandle(release: () => Promise<unknown>): () => void {
    this.#onUnusedHandle.push(release);
    return () => {
      const i = this.#onUnusedHandle.indexOf(release);
      if (i >= 0) this.#onUnusedHandle.splice(i, 1);
    };
  }

  /** Work that outlives the response (a handle release, the relay): kept alive with waitUntil. */
  background(work: () => Promise<unknown>): void {
    this.#o.waitUntil(work());
  }

  /** The response goes out now: the calls awaited so far are the ones it waited for (background ones cost it nothing). */
  responding(): void {
    this.#stateCallsBeforeResponse = this.#awaitedCalls;
  }

  #abortedLegs(): Ending["legs"] {
    const legs: NonNullable<Ending["legs"]> = {};
    if (this.chosen.decode) legs.decode = { node: this.chosen.decode, outcome: "aborted" };
    if (this.chosen.prefill && !this.prefillReported && this.chosen.prefill !== this.chosen.decode) legs.prefill = { node: this.chosen.prefill, outcome: "aborted" };
    return legs;
  }

  /** Ends the request, once: legs closed, lease released, unused handles freed, one log line. */
  end(e: Ending): void {
    if (this.#ended) return;
    this.#ended = true;
    clearInterval(this.#heartbeat);
    const pending = e.outcome === "ok" ? this.#pendingPrefill : null;
    // A P still answering after a good D keeps its leg (SGLang aborts a request whose client leaves).
    if (!pending) this.#controller.abort(e.error ?? e.outcome);
    for (const release of this.#onUnusedHandle.splice(0)) this.#o.waitUntil(this.#call(release()));
    const legs = { ...e.legs };
    if (!legs.prefill && this.chosen.prefill && !this.prefillReported && this.chosen.prefill !== this.chosen.decode) {
      legs.prefill = { node: this.chosen.prefill, outcome: "aborted" };
    }
    // P's report: its failure (sglang), else its deferred good answer, else "aborted" if it never answered
    const prefillPart = (failed: LegReport | null): { prefill?: LegReport } => {
      const prefill = failed ?? this.#takeDeferredPrefill() ?? legs.prefill;
      return prefill ? { prefill } : {};
    };
    const engineUsagePart = (): { engineUsage?: EngineUsage } => {
      const usage = this.#engineUsage?.() ?? null;
      return usage ? { engineUsage: usage } : {};
    };
    const report = (prefill: LegReport | null, remember: string | null): FinishReport => ({
      route: this.#o.route,
      status: e.status,
      ...(remember && e.outcome === "ok" ? { remember: { key: remember, prefill: this.chosen.prefill, decode: this.chosen.decode } } : {}),
      ...(this.#o.keyLabel ? { keyLabel: this.#o.keyLabel } : {}),
      ...(this.#usageDetails ? { usageDetails: this.#usageDetails } : {}),
      ...(this.#observed ? { observed: this.#observed } : {}),
      ...engineUsagePart(),
      ...(legs.decode ? { decode: legs.decode } : {}),
      ...prefillPart(prefill),
    });
    const finish =
      pending || this.#rememberKey
        ? Promise.all([pending, this.#rememberKey]).then(([prefill, remember]) => {
            this.#controller.abort("ended");
            return this.#o.state.finish(this.#leaseId, report(prefill ?? null, remember ?? null));
          })
        : this.#o.state.finish(this.#leaseId, report(null, null));
    this.#o.waitUntil(this.#call(finish));
    const entry: RequestLog = {
      requestId: this.#o.requestId,
      traceId: this.#o.trace.traceId,
      route: this.#o.route,
      model: this.#o.model,
      policy: this.#o.policy,
      prefill: this.chosen.prefill || undefined,
      decode: this.chosen.decode || undefined,
      keyHash: this.#o.keyHash?.slice(0, 16) ?? null,
      keySource: this.#o.keySource,
      rule: this.decision ? `${this.decision.prefill.rule}/${this.decision.decode.rule}` : undefined,
      mode: this.mode ?? undefined,
      reason: this.reason ?? undefined,
      uncachedTokens: this.#localFailedOver ? undefined : (this.decision?.tokens.uncachedOnDecode ?? undefined),
      status: e.status,
      outcome: e.outcome,
      routeMs: this.timings.routeMs,
      queueMs: this.timings.queueMs,
      prefillMs: this.timings.prefillMs,
      decodeTtfbMs: this.timings.decodeMs,
      predictedTtftMs: this.decision?.predictedTtftMs,
      ttftMs: this.#observed?.ttftMs,
      totalMs: Date.now() - this.#started,
      stateCalls: this.#stateCalls,
      stateCallsBeforeResponse: this.#stateCallsBeforeResponse ?? this.#awaitedCalls,
      failOpen: this.failOpen.length ? this.failOpen : undefined,
      error: e.error,
    };
    logRequest(entry);
  }
}
