import { DurableObject } from "cloudflare:workers";
import { DocumentEditor, type DocumentEditRequest, type DocumentEditResult } from "../config/document-edit";
import { silentNodeWarning } from "../observability/node-warnings";
import { selectRoute } from "../routing/select";
import type { Decision, Role, SelectionInput } from "../routing/types";
import { AlarmSchedule } from "./alarm-schedule";
import { BoundedMap } from "./bounded-map";
import type { AdmissionSettings } from "../config/cluster-view";
import { ConnectionSlots } from "../config/connection-slots";
import { admissionOf, periodsOf, pollTimeoutMsOf, retryAfterSOf, slicesOf } from "./cluster-settings";
import { RoundRobinCursors } from "./cursors";
import { EdgeAdmission, sloPredictionMs, waiterClassOf } from "./edge-admission";
import { EngineSignals } from "./engine-signals";
import { NodeHealthTable } from "./health-table";
import { expiredLeaseLog, LeaseTable, leaseTimings, leaseTtlMsOf, routedLease, type NodeLease } from "./leases";
import { NodeRateTable, profileOf } from "./node-rates";
import { RoutingPrecision } from "./routing-precision";
import { pollNodes, probeNodes } from "./node-fetch";
import { NodeHistory } from "./node-history";
import { NodeSlices } from "./node-slices";
import type { EngineReading } from "./engine-metrics";
import type { PushAnswer, ReadingsPush } from "./poller-shards";
import { SignalPollers } from "./signal-pollers";
import { PrefillUsageDetails } from "./prefill-usage-details";
import { PrefixMemory } from "./prefix-memory";
import { RecentShare } from "./recent-share";
import { routeInput, slimDecision, usesCacheAware, usesPrefixIndex, type RouteSources, type StickyPair } from "./route-selection";
import { RouterStats } from "./router-stats";
import { SilentNodes } from "./silent-nodes";
import { clusterSnapshot, historyPoint, type StatusSources } from "./snapshot";
import { openStorage, readKey, saveCursors, writeKey } from "./storage";
import type { ClusterSnapshot, ClusterView, FailoverResponse, FinishReport, KeyCount, LegReport, RouteRequest, RouteResponse } from "./types";

export { ADMISSION_RESERVATION_MS } from "./edge-admission";
export { DEFAULT_LEASE_TTL_MS } from "./leases";

const STICKY_ENTRIES = 100_000;

/**
 * The one object that coordinates a node pool. A thin shell: each piece of state is a plain
 * module with its own decisions — leases, health, cursors, sticky memory, prefix memory, recent
 * share, engine signals, the admission queue, counters, history — and this class wires them to
 * the RPC calls, the alarm and storage, and calls the pure selection core (src/routing).
 */
export class ClusterState extends DurableObject {
  // The fields the Worker tests reset between tests (runInDurableObject) are TS-private; the rest is
  // #private, like every helper method: a stub reaches nothing but the RPC methods.
  private cluster: ClusterView | null = null;
  private readonly health = new NodeHealthTable();
  private readonly recent = new RecentShare();
  // test-only TEST_CACHE_FEEDBACK=count_only: the benchmark's comparison without the index correction (bench trace --restart)
  private readonly prefixes = new PrefixMemory(undefined, (this.env as { TEST_CACHE_FEEDBACK?: string } | undefined)?.TEST_CACHE_FEEDBACK !== "count_only");
  private readonly sticky = new BoundedMap<StickyPair>(STICKY_ENTRIES);
  private readonly cursors = new RoundRobinCursors();
  private readonly signals = new EngineSignals();
  private readonly silent = new SilentNodes();
  private readonly rates = new NodeRateTable();
  private readonly precision = new RoutingPrecision();
  /** sharded polling of a large pool: its poller objects (signal-pollers.ts) */
  private readonly pollers = new SignalPollers(this.ctx.id.toString(), () => (this.env as Partial<Cloudflare.Env>).SIGNAL_POLLER);
  readonly #leases = new LeaseTable(leaseTtlMsOf(this.env));
  readonly #stats = new RouterStats();
  readonly #schedule = new AlarmSchedule();
  readonly #slices = new NodeSlices();
  readonly #admission = new EdgeAdmission();
  readonly #history = new NodeHistory();
  readonly #usageDetails = new PrefillUsageDetails();
  /** the modules as selection and the status read them: one record, so a route call allocates none for it */
  readonly #sources: RouteSources & StatusSources = {
    health: this.health,
    leases: this.#leases,
    signals: this.signals,
    recent: this.recent,
    prefixes: this.prefixes,
    sticky: this.sticky,
    cursors: this.cursors,
    stats: this.#stats,
    admission: this.#admission,
    history: this.#history,
    usageDetails: this.#usageDetails,
    silent: this.silent,
    rates: this.rates,
    precision: this.precision,
  };
  readonly #sql = this.ctx.storage.sql;
  readonly #documentEditor = new DocumentEditor(() => (this.env as { NODES: KVNamespace }).NODES);
  #wakeTimer: ReturnType<typeof setTimeout> | undefined;

  constructor(ctx: DurableObjectState, env: unknown) {
    super(ctx, env as never);
    ctx.blockConcurrencyWhile(async () => {
      const saved = openStorage(this.#sql, this.cursors);
      if (saved) this.#applyCluster(saved);
    });
  }

  /**
   * Picks P and D for one request and, unless a dry run, takes its lease: one round trip. When every
   * decode node that could serve it is busy, the call waits at the edge (edge-admission.ts).
   */
  route(req: RouteRequest): RouteResponse | Promise<RouteResponse> {
    const now = Date.now();
    // The Worker sends the document's version; the view itself only when this object lacks it.
    if (req.cluster) this.#syncCluster(req.cluster);
    const cluster = this.cluster;
    if (!cluster || cluster.version !== req.version) return { ok: false, error: { kind: "stale_view" } };
    // cells: a stored response's turn belongs to the cell that remembers its nodes; another passes it on
    if (req.spill && req.pinned && req.key && !this.sticky.get(req.key)) return { ok: false, error: { kind: "decode_busy", candidates: [] } };
    this.#sweep(now);
    // first come first served: those already waiting get what has freed before a newcomer does,
    // and a newcomer that ranks behind a request still waiting for the same nodes joins the queue
    // behind it rather than taking what that one could not (SPEC 8; issue 25 item 6)
    if (!req.dryRun && this.#admission.size > 0) this.#admitWaiting();
    const admission = admissionOf(cluster);
    const behind = req.oneHop !== true && this.#admission.waitsBehind(req, now, admission);
    // a dry run behind waiting requests of its model: it would wait too, for the nodes it would get
    if (req.dryRun && behind) {
      const picked = this.#decide(req, cluster, now, false);
      return this.#admission.wouldWait(picked, picked.ok ? picked.decision.decode.candidates : []);
    }
    if (!behind) {
      const routed = this.#decide(req, cluster, now, req.oneHop !== true, admission);
      if (routed.ok || routed.error.kind !== "decode_busy") return routed;
      // a dry run: what it would get once a node frees (the picks without the guard)
      if (req.dryRun) return this.#admission.wouldWait(this.#decide(req, cluster, now, false), routed.error.candidates);
      // a cell with another to try: busy, nothing queued
      if (req.spill) return routed;
    } else if (req.spill) return { ok: false, error: { kind: "decode_busy", candidates: [] } };
    if (req.leaseId && this.#leases.consumeTombstone(req.leaseId)) return { ok: false, error: { kind: "client_gone" } };
    const admitted = this.#admission.wait(
      req,
      req.leaseId ?? this.#leases.newId(now),
      now,
      admission,
      this.#retryAfterS(cluster, now),
      this.#predictedOnceFree(req, cluster, now, admission),
    );
    this.#armWake();
    return admitted;
  }

  /** A request waiting at the edge saw the document edited: applied unless older than the one in force, and the waiters decided again under it. */
  syncView(view: ClusterView): void {
    this.#syncCluster(view);
    if (this.#admission.size > 0) this.#admitWaiting();
  }

  /** The request still runs: its lease lives another TTL. False when it is gone (expired or released). */
  renew(leaseId: string): boolean {
    // the first renewal of a lease admitted from the queue confirms it: its Worker is still there
    this.#admission.unreserve(leaseId);
    return this.#leases.renew(leaseId, Date.now());
  }

  /** P answered (or gave up): its part of the lease ends now, while D's goes on. */
  prefillDone(leaseId: string, report: LegReport): void {
    this.#notePrefillMs(this.#leases.get(leaseId), report);
    this.#leases.endPrefill(leaseId, report.node);
    this.#legEnded("prefill", report, Date.now());
  }

  /** A leg failed before anything reached the client: count the failure, move the lease to the next node of that role that may take work. */
  failover(leaseId: string, role: Role, report: LegReport, wantNext = true): FailoverResponse {
    const now = Date.now();
    this.health.report(report, now, this.cluster?.health);
    const moved = wantNext ? this.#leases.failover(leaseId, role, (node) => this.health.mayTake(node, now)) : null;
    if (!moved) return { next: null };
    // the failed D never held the request's KV; the next one will
    if (role === "decode") this.signals.moved(moved.from, moved.next, moved.lease.tokens);
    // the node that prefills moved: its rate and the engine's answer are the next one's
    const timing = moved.lease.timing;
    if (timing && (role === "prefill" || moved.lease.mode !== "disaggregated")) timing.prefiller = moved.next;
    this.health.picked(moved.next, now);
    if (moved.prefill) this.health.picked(moved.prefill, now);
    return moved.prefill ? { next: moved.next, prefill: moved.prefill } : { next: moved.next };
  }

  /** The request ended (completed, failed or aborted): release whatever the lease still holds, once. */
  finish(leaseId: string | null, report: FinishReport): void {
    const now = Date.now();
    this.count(report.route, report.status, report.keyLabel);
    if (report.usageDetails) this.#usageDetails.note(report.usageDetails.node, report.usageDetails.reported);
    if (report.remember) this.sticky.remember(report.remember.key, { prefill: report.remember.prefill, decode: report.remember.decode });
    if (report.engineUsage?.anomaly) {
      const h = this.health.get(report.engineUsage.node);
      if (h) h.usageAnomalies += 1;
    } else if (report.engineUsage && leaseId) this.prefixes.learn(this.#leases.get(leaseId), report.engineUsage, this.cluster);
    if (leaseId) this.#learnFrom(this.#leases.get(leaseId), report, now);
    if (report.prefill) this.#legEnded("prefill", report.prefill, now);
    if (report.decode) this.#legEnded("decode", report.decode, now);
    if (!leaseId) return;
    // a request still waiting at the edge whose client left: out of the queue, never given a lease
    this.#admission.leave(leaseId);
    const released = this.#leases.release(leaseId);
    if (!released) this.#leases.tombstone(leaseId, now);
    else this.#freed(released);
  }

  /**
   * A poller's readings (sharded polling, poller-shards.ts): taken when pushed for the document in
   * force and newer than what the node has; the poller hears `stale_version` otherwise.
   */
  pushReadings(push: ReadingsPush): PushAnswer {
    const answer = this.pollers.take(push, this.cluster, Date.now(), (node, reading, at) => this.#polled(node, reading, at));
    if (answer === "ok" && this.#admission.size > 0) this.#admitWaiting();
    return answer;
  }

  /** Admin writes of the cluster document, one at a time (src/config/document-edit.ts says why). */
  editDocument(req: DocumentEditRequest): Promise<DocumentEditResult> {
    return this.#documentEditor.run(req);
  }

  /** Keeps the last valid document text, so a new isolate can serve it while KV holds a bad one. */
  saveLastGoodConfig(raw: string): void {
    writeKey(this.#sql, "last_good_document", raw);
  }

  lastGoodConfig(): string | null {
    return readKey(this.#sql, "last_good_document");
  }

  /** Counts a request that never reached routing (bad input, auth), for /metrics. */
  count(route: string, status: number, keyLabel?: string): void {
    this.#stats.countRequest(route, status);
    if (keyLabel) this.#stats.countKey(keyLabel);
  }

  /** Counts one authenticated request under its key label, for /metrics. */
  countKey(label: string): void {
    this.#stats.countKey(label);
  }

  keyCounts(): KeyCount[] {
    return this.#stats.keyCounts();
  }

  /** Shared state as operators see it; `withHistory`: include the status page's per-node history (kept off /metrics). */
  snapshot(cluster?: ClusterView, withHistory = false): ClusterSnapshot {
    const now = Date.now();
    if (cluster) this.#syncCluster(cluster);
    this.#sweep(now);
    const snap = clusterSnapshot(this.cluster, this.#sources, now, withHistory);
    const pollers = this.pollers.status(this.cluster, now);
    return pollers ? { ...snap, pollers } : snap;
  }

  /**
   * Runs the jobs due (alarm-schedule.ts) — this sub-tick's slice of the probes and of the /metrics
   * polls (node-slices.ts), through the invocation's six connections — then re-arms itself.
   * Routing never waits for it: a slow node holds only its own probe or poll, and one slot. A pool
   * past `signals.shardAbove` nodes is polled by poller objects: the poll job then only watches them.
   */
  override async alarm(): Promise<void> {
    const cluster = this.cluster;
    if (!cluster) return;
    const jobs = this.#schedule.take(periodsOf(cluster), Date.now());
    const slices = slicesOf(cluster);
    const env = this.env as unknown as Record<string, unknown>;
    const slots = new ConnectionSlots();
    await Promise.all([
      jobs.includes("probe")
        ? probeNodes(env, cluster, this.#slices.take("probe", cluster.nodes, slices.probe), slots, (node, ok) => {
            // back after its probes failed: most likely restarted, with an empty prefix cache (llm-d#2853)
            if (this.health.probed(node, ok, Date.now(), cluster.health)) this.prefixes.forget(node, "probes_recovered");
          })
        : null,
      !jobs.includes("poll")
        ? null
        : this.pollers.count(cluster) > 0
          ? this.pollers.supervise(cluster, Date.now())
          : pollNodes(env, pollTimeoutMsOf(cluster), this.#slices.take("poll", cluster.nodes, slices.poll), slots, (node, reading) => this.#polled(node, reading, Date.now())),
    ]);
    const now = Date.now();
    this.#sweep(now);
    saveCursors(this.#sql, this.cursors);
    if (this.cluster && this.#history.due(now)) this.#history.add(historyPoint(this.cluster, now, this.#sources));
    this.#admitWaiting();
    await this.ctx.storage.setAlarm(this.#schedule.next());
  }

  /** A node's /metrics poll answered at `at` (by this alarm, or a poller's push): `reading` null when it failed. */
  #polled(node: string, reading: EngineReading | null, at: number): void {
    const health = this.health.get(node);
    if (!health) return;
    const load = this.#leases.loadOf(node);
    // the await protocol (vllm) sends D its leg once P answered; the others send it with P's
    const unseen = this.cluster?.protocol === "vllm" && load ? { requests: load.awaiting, tokens: load.awaitingTokens } : undefined;
    if (reading) this.signals.record(node, reading, at, load?.prefill ?? 0, unseen);
    if (reading?.prefixCacheHits !== undefined) this.#usageDetails.prefixHits(node, reading.prefixCacheHits);
    if (this.silent.polled(node, reading !== null, health.probeUp)) console.warn(JSON.stringify({ event: "node_signals_missing", node, message: silentNodeWarning(node) }));
  }

  /**
   * Selection with what the modules hold, and, unless a dry run, the lease taken. Given the
   * admission settings (a newcomer, not a waiter offered capacity), a `flex` request whose
   * decision predicts a TTFT over admission.ttftSloMs is refused at once instead (SPEC 9).
   */
  #decide(req: RouteRequest, cluster: ClusterView, now: number, guarded: boolean, slo?: AdmissionSettings): RouteResponse {
    const input = routeInput(req, cluster, now, guarded, this.#sources);
    const result = selectRoute(input);
    if (!result.ok) return { ok: false, error: result.error };
    const decision = result.value;
    if (req.dryRun) return { ok: true, leaseId: null, decision };
    const refused = slo ? this.#admission.overSlo(req, slo, sloPredictionMs(decision.predictedTtftMs, null)) : null;
    if (refused) return refused;
    // released before this call arrived (its client left mid-call): decided, never taken
    if (req.leaseId && this.#leases.consumeTombstone(req.leaseId)) return { ok: true, leaseId: null, decision: slimDecision(decision) };
    return { ok: true, leaseId: this.#take(req, cluster, input, decision, now), decision: slimDecision(decision) };
  }

  /** A flex request under a TTFT objective that must wait: the selection's predicted TTFT of the option it would get once a node frees (without the guard); null otherwise. */
  #predictedOnceFree(req: RouteRequest, cluster: ClusterView, now: number, s: AdmissionSettings): number | null {
    if (s.ttftSloMs == null || waiterClassOf(req, s).tier !== "flex") return null;
    const picked = selectRoute(routeInput(req, cluster, now, false, this.#sources));
    return picked.ok ? (picked.value.predictedTtftMs ?? null) : null;
  }

  /** A decision applied: cursors, counters, stickiness, prefix memory, and the lease with the load it adds. */
  #take(req: RouteRequest, cluster: ClusterView, input: SelectionInput, decision: Decision, now: number): string {
    const d = decision.decode.id;
    this.cursors.set(decision.cursors);
    this.#stats.countRouted(decision);
    if (req.key) this.sticky.remember(req.key, { prefill: decision.prefill.id, decode: d });
    const prediction = usesPrefixIndex(cluster, req, input.colocated) ? this.prefixes.routed(req, decision, input, cluster.policy.cacheAware) : undefined;
    if (prediction && usesCacheAware(cluster.policy)) this.#stats.countPrefix(req.prefixHashes.length, prediction.matched);
    const leaseId = req.leaseId ?? this.#leases.newId(now);
    const lease = routedLease(req, decision, input.colocated, now + this.#leases.ttlMs, prediction);
    lease.timing = leaseTimings(req, decision, this.#leases.loadOf(decision.mode === "disaggregated" ? decision.prefill.id : d)?.prefillCost ?? 0);
    this.#leases.take(leaseId, lease);
    this.signals.dispatched(d, lease.tokens);
    // in half-open, this request is the node's one trial (a local prefill's P is D itself)
    if (lease.prefill && decision.prefill.rule !== "local_prefill") this.health.picked(lease.prefill, now);
    this.health.picked(d, now);
    this.recent.count(lease.prefill, d, cluster.policy.cacheAware.shareHalfLife, decision.tokens.prefillWork, decision.tokens.decodeWork);
    return leaseId;
  }

  /** P answered: its time, kept with the lease until the request ends (node-rates.ts learns then). */
  #notePrefillMs(lease: NodeLease | undefined, report: LegReport): void {
    if (lease?.timing && report.outcome === "ok" && report.ms !== undefined && lease.timing.prefillMs === undefined) lease.timing.prefillMs = report.ms;
  }

  /**
   * An answered request teaches its nodes' rates (node-rates.ts) from its legs' times and the
   * engine's token counts, adds its actual / predicted TTFT, and, as a conversation's follow-up,
   * counts for routing precision.
   */
  #learnFrom(lease: NodeLease | undefined, report: FinishReport, now: number): void {
    const t = lease?.timing;
    if (!lease || !t) return;
    if (report.prefill) this.#notePrefillMs(lease, report.prefill);
    const usage = report.engineUsage?.node === t.prefiller ? report.engineUsage : undefined;
    if (usage && t.key) this.precision.observe(t.key, usage.promptTokens, usage.cachedTokens, now);
    if (report.status !== 200 || report.decode?.outcome !== "ok") return;
    const observed = report.observed;
    const cluster = this.cluster;
    const profiles = (node: string) => profileOf(cluster?.profile, cluster?.nodes.find((n) => n.id === node)?.profile);
    this.rates.learn(
      {
        prefiller: t.prefiller,
        decode: lease.decode,
        disaggregated: lease.mode === "disaggregated",
        aheadCost: t.aheadCost,
        promptTokens: usage?.promptTokens ?? t.promptTokens,
        cachedTokens: usage ? usage.cachedTokens : t.predictedCached,
        transferTokens: t.transferTokens,
        prefillMs: t.prefillMs,
        ttftMs: observed?.ttftMs,
        batch: this.#leases.loadOf(lease.decode)?.decode,
        streamEvents: observed?.streamEvents,
        streamSpanMs: observed?.streamSpanMs,
        streamTokens: observed?.streamTokens,
        streamEventsNotTokens: observed?.streamEventsNotTokens,
      },
      now,
      profiles,
    );
    if (t.predictedTtftMs !== undefined && observed?.ttftMs !== undefined) this.#stats.observePrediction(observed.ttftMs, t.predictedTtftMs);
  }

  /** A leg's outcome for the node's health, and its latency when it answered. */
  #legEnded(leg: Role, report: LegReport, now: number): void {
    this.health.report(report, now, this.cluster?.health);
    this.#stats.observeLeg(leg, report);
  }

  /** Expired leases are released, so a request whose release was lost cannot leak load. */
  #sweep(now: number, force = false): void {
    if (!this.#leases.sweepDue(now, force)) return;
    for (const [id, lease] of this.#leases.expire(now)) {
      // its request stopped renewing without finishing (the runtime dropped it): counted and logged here
      const unconfirmed = this.#admission.unreserve(id);
      this.#stats.countExpired(lease.route);
      this.#freed(lease);
      console.warn(JSON.stringify(expiredLeaseLog(id, lease, unconfirmed)));
    }
  }

  /** A decode lease ended: the projection frees its tokens, and a waiting request may fit now. */
  #freed(lease: NodeLease): void {
    this.signals.released(lease.decode, lease.tokens);
    this.#admission.released(Date.now());
    if (this.#admission.size > 0) queueMicrotask(() => this.#admitWaiting());
  }

  /**
   * The retry-after a refused waiter is given: the next poll of the engines' signals; when every
   * decode node is in a busy window its 429/503 opened, what is left of the earliest (issue 25
   * item 7: a window of 60 s was answered "retry after 1").
   */
  #retryAfterS(cluster: ClusterView | null, now: number): number {
    const poll = retryAfterSOf(cluster);
    const windows = (cluster?.nodes ?? []).filter((n) => n.role !== "prefill").map((n) => this.health.view(n.id).busyUntil);
    if (!windows.length || windows.some((until) => until <= now)) return poll;
    return Math.max(1, Math.ceil((Math.min(...windows) - now) / 1000));
  }

  /** Offers the waiting requests what the nodes can take now (edge-admission.ts), then re-arms the wake-up. */
  #admitWaiting(): void {
    const cluster = this.cluster;
    const now = Date.now();
    this.#sweep(now, this.#admission.reserving);
    this.#admission.offer(now, cluster, this.#leases, (req) => this.#decide(req, cluster!, now, true), this.#retryAfterS(cluster, now));
    this.#armWake();
  }

  /** One timer for the next thing that needs the object without a call: a queue deadline, a reservation's end, a busy window's end. */
  #armWake(): void {
    clearTimeout(this.#wakeTimer);
    const at = this.#admission.nextWake();
    if (at !== null) this.#wakeTimer = setTimeout(() => this.#admitWaiting(), Math.max(0, Math.min(at, this.health.busyEnd(Date.now())) - Date.now()) + 5);
  }

  #syncCluster(view: ClusterView): void {
    if (this.cluster?.version === view.version) return;
    // a document read before the one in force is older: an isolate still on it reloads (stale_view)
    if (this.cluster && (view.readAt ?? 0) < (this.cluster.readAt ?? 0)) return;
    this.#applyCluster(view);
    writeKey(this.#sql, "cluster", JSON.stringify(view));
    void this.#ensureAlarm();
    // a sharded pool's pollers hear the new document now, not at the next poll job
    void this.pollers.supervise(view, Date.now());
  }

  #applyCluster(view: ClusterView): void {
    this.cluster = view;
    // Nodes removed from the document are forgotten (their leases still release normally).
    for (const id of this.health.sync(new Set(view.nodes.map((n) => n.id)))) {
      this.prefixes.forgetNode(id);
      this.recent.forget(id);
      this.#leases.forget(id);
      this.signals.forget(id);
      this.pollers.forget(id);
      this.silent.forget(id);
      this.rates.forget(id);
    }
    this.#schedule.configure(periodsOf(view), Date.now());
    // new nodes or thresholds may admit requests that wait
    if (this.#admission.size > 0) queueMicrotask(() => this.#admitWaiting());
  }

  /** The alarm fires for the earliest job due: a new document's periods move it sooner or later at once. */
  async #ensureAlarm(): Promise<void> {
    const current = await this.ctx.storage.getAlarm();
    const next = this.#schedule.next();
    if (this.cluster && current !== next) await this.ctx.storage.setAlarm(next);
  }
}
