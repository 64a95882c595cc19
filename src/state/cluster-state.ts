import { DurableObject } from "cloudflare:workers";
import { DocumentEditor, type DocumentEditRequest, type DocumentEditResult } from "../config/document-edit";
import { PrefixIndex } from "../routing/prefix-index";
import { selectRoute } from "../routing/select";
import { isBusy } from "../routing/kv-guard";
import type { CandidateNode, Decision, GuardSettings, NodeSignals, Role } from "../routing/types";
import { AdmissionQueue, type AdmissionSettings } from "./admission-queue";
import { AlarmSchedule, type AlarmJob } from "./alarm-schedule";
import { BoundedMap } from "./bounded-map";
import { CacheFeedback, type CachePrediction, type EngineUsage } from "./cache-feedback";
import { CharsPerToken } from "./chars-per-token";
import { RoundRobinCursors } from "./cursors";
import { EngineSignals, type SignalSettings } from "./engine-signals";
import { breakerState, isHealthy, onFailure, onInconclusive, onPicked, onProbe, onSuccess, probeSettings } from "./health";
import { NodeHealthTable } from "./health-table";
import { LeaseTable, type NodeLease } from "./leases";
import { pollEngineMetrics, probeNode } from "./node-fetch";
import { NodeHistory } from "./node-history";
import { RecentShare } from "./recent-share";
import { RouterStats } from "./router-stats";
import type { ClusterSnapshot, ClusterView, FailoverResponse, FinishReport, KeyCount, LegReport, NodeSignalsStatus, RouteRequest, RouteResponse } from "./types";
import { freshUsageDetails, noteUsageDetails, usageDetailsVerdict, usageDetailsWarning, type UsageDetailsRecord } from "../observability/usage-details";

/**
 * A lease expires this long after it was taken or last renewed (LEASE_TTL_MS var): a live
 * request renews it every third of that, so a long stream keeps counting as load while a
 * request that died without releasing stops counting soon.
 */
export const DEFAULT_LEASE_TTL_MS = 60_000;
/** per role; ~130 bytes an entry (PrefixIndex.BYTES_PER_ENTRY_ESTIMATE): ~26 MB for both */
const PREFIX_INDEX_ENTRIES = 100_000;
const STICKY_ENTRIES = 100_000;
/** expired leases are looked for at most this often (every route call would be wasteful) */
const SWEEP_EVERY_MS = 1_000;
/** SPEC 8 defaults, for a view saved before the document had these blocks */
const DEFAULT_SIGNALS: SignalSettings = { intervalMs: 5_000, staleMs: 15_000, kvBusy: 0.9, queueBusy: 8 };
const DEFAULT_ADMISSION: AdmissionSettings = { queueMs: 30_000, maxQueued: 1_000 };
/**
 * A request admitted after waiting holds its lease only this long until its Worker confirms it
 * (renew): a Worker whose handler was cancelled while it waited (its client gone) never does, so
 * no lease outlives it by more than this.
 */
export const ADMISSION_RESERVATION_MS = 5_000;
/** the status page's charts: the last 15 minutes of per-node figures, a point a second at most */
const HISTORY_KEEP_MS = 15 * 60_000;
const HISTORY_POINTS = 1_000;
const HISTORY_EVERY_MS = 1_000;

type ViewNode = ClusterView["nodes"][number];
type Cluster = ClusterView;
/** a route call waiting in the admission queue, and how to answer it */
interface QueuedRoute {
  req: RouteRequest;
  answer: (r: RouteResponse) => void;
}

/**
 * The one object that coordinates a node pool. A thin shell: each piece of state is a plain
 * module with its own decisions (leases, health, cursors, sticky memory, prefix index, recent
 * share, counters); this class wires them to the RPC calls, the alarm and storage, and calls the
 * pure selection core (src/routing) with what they hold.
 */
export class ClusterState extends DurableObject {
  private cluster: ClusterView | null = null;
  private readonly health = new NodeHealthTable();
  private readonly leases: LeaseTable;
  private readonly recent = new RecentShare();
  private readonly prefixIndex = { prefill: new PrefixIndex(PREFIX_INDEX_ENTRIES), decode: new PrefixIndex(PREFIX_INDEX_ENTRIES) };
  private readonly sticky = new BoundedMap<{ prefill: string; decode: string }>(STICKY_ENTRIES);
  private readonly stats = new RouterStats();
  private readonly cursors = new RoundRobinCursors();
  private readonly signals = new EngineSignals();
  private readonly schedule = new AlarmSchedule();
  private readonly admission = new AdmissionQueue<QueuedRoute>();
  /** leases admitted from the queue and not yet confirmed by their Worker, until when */
  private readonly reservations = new Map<string, number>();
  private readonly history = new NodeHistory(HISTORY_KEEP_MS, HISTORY_POINTS);
  /** each node's characters per token, learned from its answers */
  private readonly charsPerToken = new CharsPerToken();
  /** predicted vs reported cached tokens per node, and the misses that say a node lost its cache */
  private readonly cacheFeedback: CacheFeedback;
  private lastSample = 0;
  private wakeTimer: ReturnType<typeof setTimeout> | undefined;
  /** per prefill node: does it report prompt_tokens_details (observability/usage-details.ts) */
  private readonly usageDetails = new Map<string, UsageDetailsRecord>();
  private lastSweep = 0;
  private readonly documentEditor = new DocumentEditor(() => (this.env as { NODES: KVNamespace }).NODES);

  constructor(ctx: DurableObjectState, env: unknown) {
    super(ctx, env as never);
    const ttl = Number((env as { LEASE_TTL_MS?: string } | undefined)?.LEASE_TTL_MS);
    this.leases = new LeaseTable(Number.isFinite(ttl) && ttl > 0 ? ttl : DEFAULT_LEASE_TTL_MS);
    // test-only: the benchmark's comparison without the index correction (bench trace --restart)
    this.cacheFeedback = new CacheFeedback((env as { TEST_CACHE_FEEDBACK?: string } | undefined)?.TEST_CACHE_FEEDBACK !== "count_only");
    ctx.blockConcurrencyWhile(async () => {
      ctx.storage.sql.exec(`CREATE TABLE IF NOT EXISTS cursor (pool TEXT PRIMARY KEY, value INTEGER NOT NULL)`);
      ctx.storage.sql.exec(`CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL)`);
      for (const row of ctx.storage.sql.exec<{ pool: string; value: number }>(`SELECT pool, value FROM cursor`)) {
        if (row.pool === "prefill" || row.pool === "decode") this.cursors.restore(row.pool, row.value);
      }
      const saved = ctx.storage.sql.exec<{ value: string }>(`SELECT value FROM kv WHERE key = 'cluster'`).toArray()[0];
      if (saved) this.applyCluster(JSON.parse(saved.value) as ClusterView);
    });
  }

  // ---- RPC: routing ---------------------------------------------------------------

  /**
   * Picks P and D for one request and, unless a dry run, takes its lease: one round trip. When every
   * decode node that could serve it is busy, the call waits in the admission queue (FCFS, nothing
   * sent upstream) until one frees or `admission.queueMs` passes; other calls go on meanwhile.
   */
  route(req: RouteRequest): RouteResponse | Promise<RouteResponse> {
    const now = Date.now();
    // The Worker sends the document's version; the view itself only when this object lacks it.
    if (req.cluster) this.syncCluster(req.cluster);
    const cluster = this.cluster;
    if (!cluster || cluster.version !== req.version) return { ok: false, error: { kind: "stale_view" } };
    this.sweep(now);
    // first come first served: those already waiting get what has freed before a newcomer does
    if (!req.dryRun && this.admission.size > 0) this.admitWaiting();
    const guarded = req.oneHop !== true;
    const routed = this.decide(req, cluster, now, guarded);
    if (routed.ok || routed.error.kind !== "decode_busy") return routed;
    const busyCandidates = routed.error.candidates;
    if (req.dryRun) {
      // what it would get once a node frees: the picks without the guard, the candidates as they are now
      const picked = this.decide(req, cluster, now, false);
      if (!picked.ok) return picked;
      const decision = { ...picked.decision, decode: { ...picked.decision.decode, candidates: busyCandidates } };
      return { ...picked, decision, wouldWait: { queued: this.admission.size } };
    }
    if (req.leaseId && this.leases.consumeTombstone(req.leaseId)) return { ok: false, error: { kind: "client_gone" } };
    const settings = admissionOf(cluster);
    const retryAfterS = Math.max(1, Math.ceil(signalsOf(cluster).intervalMs / 1000));
    const ticket = req.leaseId ?? this.leases.newId(now);
    return new Promise<RouteResponse>((answer) => {
      const waiter = settings.queueMs > 0 ? this.admission.enqueue(ticket, { req: { ...req, leaseId: ticket }, answer }, now, settings) : null;
      if (!waiter) {
        this.stats.countRejected("queue_full");
        answer({ ok: false, error: { kind: "cluster_busy", reason: "queue_full", retryAfterS } });
        return;
      }
      this.armWake();
    });
  }

  /** Selection with what the modules hold, and, unless a dry run, the lease taken. */
  private decide(req: RouteRequest, cluster: Cluster, now: number, guarded: boolean): RouteResponse {
    const s = signalsOf(cluster);
    const guard: GuardSettings | null = guarded ? { kvBusy: s.kvBusy, queueBusy: s.queueBusy } : null;
    // no model (SGLang's /generate, a tokenizer call without one): any node
    const serves = (n: ViewNode) => !n.models || !req.model || n.models.includes(req.model);
    const pool = (role: Role) => cluster.nodes.filter((n) => serves(n) && (n.role === role || n.role === "both")).map((n) => this.candidate(n, role, now));
    // one-hop requests (embeddings, tokenizer) take one node, like colocated
    const colocated = cluster.protocol === "colocated" || req.oneHop === true;
    const usesPrefix = cluster.policy.prefill === "cache_aware" || cluster.policy.decode === "cache_aware";
    // conditional disaggregation asks what D holds whatever the policy: the index is kept for it too
    const indexed = (usesPrefix || (!colocated && cluster.policy.disaggregation === "conditional")) && req.prefixHashes.length > 0;
    const prefill = colocated ? [] : pool("prefill");
    const decode = pool("decode");
    const match = (role: Role, nodes: CandidateNode[]) =>
      indexed
        ? this.prefixIndex[role].match(
            req.prefixHashes,
            nodes.map((n) => n.id),
          )
        : {};
    const prefixMatches = { prefill: match("prefill", prefill), decode: match("decode", decode) };
    const sticky = req.key ? (this.sticky.get(req.key) ?? null) : null;
    const result = selectRoute({
      policy: cluster.policy,
      colocated,
      prefill,
      decode,
      key: req.key,
      prefixMatches,
      prefixBlockCount: req.prefixHashes.length,
      sticky,
      pinned: req.pinned === true,
      cursors: { prefill: this.cursors.prefill, decode: this.cursors.decode },
      guard,
      promptChars: req.promptChars ?? 0,
    });
    if (!result.ok) return { ok: false, error: result.error };
    const decision = result.value;
    if (req.dryRun) return { ok: true, leaseId: null, decision };
    if (req.leaseId && this.leases.consumeTombstone(req.leaseId)) return { ok: true, leaseId: null, decision: slimDecision(decision) };

    this.cursors.set(decision.cursors);
    const p = decision.prefill.id;
    const d = decision.decode.id;
    // D alone: the prefill is D's work, held in the lease's prefill part until D's first byte
    const local = decision.prefill.rule === "local_prefill";
    for (const role of ["prefill", "decode"] as const) this.stats.countDecision(role, decision[role].rule);
    this.stats.countDisagg(decision.mode, decision.reason);
    if (req.key) this.sticky.remember(req.key, { prefill: p, decode: d });
    let prediction: CachePrediction | undefined;
    if (indexed) {
      // the node that prefills (P; D when it serves alone or colocated) and what it was believed to hold
      const prefiller: { node: string; role: Role } = decision.mode === "disaggregated" ? { node: p, role: "prefill" } : { node: d, role: "decode" };
      const matched = prefixMatches[prefiller.role][prefiller.node] ?? 0;
      if (usesPrefix) this.stats.countPrefix(req.prefixHashes.length, matched);
      const maxBlocks = cluster.policy.cacheAware.maxBlocksPerRequest;
      prediction = {
        ...prefiller,
        hashes: req.prefixHashes.slice(0, maxBlocks),
        matched,
        promptChars: req.promptChars ?? 0,
        blockChars: cluster.policy.cacheAware.blockChars,
      };
      // who holds the prompt now: P computed it, D computed or received it. A node in both pools
      // (role both) has one cache, so each pool's index learns it.
      const holders = colocated || local ? [d] : [p, d];
      for (const node of new Set(holders)) this.recordPrefix(req.prefixHashes, node, maxBlocks, { prefill, decode });
    }
    const leaseId = req.leaseId ?? this.leases.newId(now);
    const lease: NodeLease = {
      prefill: colocated ? null : local ? d : p,
      decode: d,
      tokens: decision.tokens.prompt > 0 ? decision.tokens.prompt : req.tokens,
      prefillTokens: decision.tokens.prefillWork,
      mode: decision.mode,
      ...(prediction ? { prediction } : {}),
      promptChars: req.promptChars ?? 0,
      expiresAt: now + this.leases.ttlMs,
      route: req.route ?? "other",
      requestId: req.requestId,
      fallbacks: { prefill: [...decision.prefill.fallbacks], decode: [...decision.decode.fallbacks] },
      model: req.model,
    };
    this.leases.take(leaseId, lease);
    this.signals.dispatched(d, lease.tokens);
    if (lease.prefill && !local) this.picked(lease.prefill, now);
    this.picked(d, now);
    this.recent.count(lease.prefill, d, cluster.policy.cacheAware.shareHalfLife, { prefill: decision.tokens.prefillWork, decode: decision.tokens.decodeWork });
    // The request needs only the picks: candidates and fallbacks stay here (the lease keeps the fallbacks).
    return { ok: true, leaseId, decision: slimDecision(decision) };
  }

  /** The request still runs: its lease lives another TTL. False when it is gone (expired or released). */
  renew(leaseId: string): boolean {
    // the first renewal of a lease admitted from the queue confirms it: its Worker is still there
    this.reservations.delete(leaseId);
    return this.leases.renew(leaseId, Date.now());
  }

  /** P answered (or gave up): its part of the lease ends now, while D's goes on. */
  prefillDone(leaseId: string, report: LegReport): void {
    this.leases.endPrefill(leaseId, report.node);
    this.applyOutcome(report, Date.now());
    if (report.ms !== undefined && report.outcome === "ok") this.stats.observePrefill(report.ms);
  }

  /**
   * A leg failed before anything reached the client: count the failure and move the
   * lease to the next-ranked node of that role that may take work now.
   */
  failover(leaseId: string, role: Role, report: LegReport, wantNext = true): FailoverResponse {
    const now = Date.now();
    this.applyOutcome(report, now);
    const lease = this.leases.get(leaseId);
    if (!lease || !wantNext) return { next: null };
    const candidates = lease.fallbacks[role];
    const nextIndex = candidates.findIndex((id) => {
      const h = this.health.get(id);
      return h !== undefined && isHealthy(h, now);
    });
    if (nextIndex < 0) return { next: null };
    const next = candidates[nextIndex]!;
    lease.fallbacks[role] = candidates.slice(nextIndex + 1);
    const moved = this.leases.move(leaseId, role, next);
    if (role === "decode") {
      // the failed D never held the request's KV; the next one will
      if (moved?.from) this.signals.released(moved.from, lease.tokens);
      this.signals.dispatched(next, lease.tokens);
      // a local prefill moves with its D: the next D prefills it
      if (lease.mode === "local" && lease.prefill !== null && lease.prefill === moved?.from) this.leases.move(leaseId, "prefill", next);
    }
    this.picked(next, now);
    return { next };
  }

  /** The request ended (completed, failed or aborted): release whatever the lease still holds, once. */
  finish(leaseId: string | null, report: FinishReport): void {
    const now = Date.now();
    this.stats.countRequest(report.route, report.status);
    if (report.keyLabel) this.stats.countKey(report.keyLabel);
    if (report.usageDetails) {
      const { node, reported } = report.usageDetails;
      const record = this.usageDetails.get(node) ?? freshUsageDetails();
      this.usageDetails.set(node, record);
      if (noteUsageDetails(record, reported)) console.warn(JSON.stringify({ event: "prefill_usage_details_missing", node, message: usageDetailsWarning(node) }));
    }
    if (report.remember) this.sticky.remember(report.remember.key, { prefill: report.remember.prefill, decode: report.remember.decode });
    if (report.engineUsage && leaseId) this.learnFromAnswer(leaseId, report.engineUsage);
    if (report.prefill) {
      this.applyOutcome(report.prefill, now);
      if (report.prefill.ms !== undefined && report.prefill.outcome === "ok") this.stats.observePrefill(report.prefill.ms);
    }
    if (report.decode) {
      this.applyOutcome(report.decode, now);
      if (report.decode.ms !== undefined && report.decode.outcome === "ok") this.stats.observeTtfb(report.decode.ms);
    }
    if (!leaseId) return;
    // a request still waiting at the edge whose client left: out of the queue, never given a lease
    const waiter = this.admission.leave(leaseId);
    if (waiter) waiter.item.answer({ ok: false, error: { kind: "client_gone" } });
    this.reservations.delete(leaseId);
    const released = this.leases.release(leaseId);
    if (!released) this.leases.tombstone(leaseId, now);
    else this.freed(released);
  }

  /** Admin writes of the cluster document, one at a time (src/config/document-edit.ts says why). */
  editDocument(req: DocumentEditRequest): Promise<DocumentEditResult> {
    return this.documentEditor.run(req);
  }

  /** Keeps the last valid document text, so a new isolate can serve it while KV holds a bad one. */
  saveLastGoodConfig(raw: string): void {
    this.ctx.storage.sql.exec(`INSERT INTO kv (key, value) VALUES ('last_good_document', ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value`, raw);
  }

  lastGoodConfig(): string | null {
    return this.ctx.storage.sql.exec<{ value: string }>(`SELECT value FROM kv WHERE key = 'last_good_document'`).toArray()[0]?.value ?? null;
  }

  /** Counts a request that never reached routing (bad input, auth), for /metrics. */
  count(route: string, status: number, keyLabel?: string): void {
    this.stats.countRequest(route, status);
    if (keyLabel) this.stats.countKey(keyLabel);
  }

  /** Counts one authenticated request under its key label, for /metrics. */
  countKey(label: string): void {
    this.stats.countKey(label);
  }

  keyCounts(): KeyCount[] {
    return this.stats.keyCounts();
  }

  /** Shared state as operators see it; `withHistory`: include the status page's per-node history (kept off /metrics). */
  snapshot(cluster?: ClusterView, withHistory = false): ClusterSnapshot {
    const now = Date.now();
    if (cluster) this.syncCluster(cluster);
    this.sweep(now);
    const nodes = (this.cluster?.nodes ?? []).map((n) => {
      const h = this.health.view(n.id);
      const c = this.leases.loadOf(n.id);
      return {
        id: n.id,
        url: n.url,
        roles: n.role === "both" ? (["prefill", "decode"] as Role[]) : [n.role],
        group: n.group ?? null,
        weight: n.weight,
        drain: n.drain,
        healthy: isHealthy(h, now),
        probeUp: h.probeUp,
        breaker: breakerState(h, now),
        ejectedUntil: h.ejectedUntil,
        failureStreak: h.failureStreak,
        failuresTotal: h.failuresTotal,
        lastFailureAt: h.lastFailureAt,
        inflight: { prefill: c?.prefill ?? 0, decode: c?.decode ?? 0, tokens: c?.tokens ?? 0, prefillTokens: c?.prefillTokens ?? 0 },
        requestsTotal: { prefill: c?.requestsPrefill ?? 0, decode: c?.requestsDecode ?? 0 },
        signals: this.signalsStatus(n, now),
        usageDetails: usageDetailsVerdict(this.usageDetails.get(n.id)),
        prefix: { ...this.cacheFeedback.totals(n.id), charsPerToken: Math.round(this.charsPerToken.of(n.id) * 1000) / 1000 },
      };
    });
    return {
      version: this.cluster?.version ?? null,
      nodes,
      leases: this.leases.size,
      expiredLeases: this.stats.expiredLeases,
      requests: this.stats.requests(),
      decisions: this.stats.decisions(),
      disagg: this.stats.disagg(),
      prefix: {
        prefillEntries: this.prefixIndex.prefill.size,
        decodeEntries: this.prefixIndex.decode.size,
        maxEntries: PREFIX_INDEX_ENTRIES,
        ...this.stats.prefix,
      },
      latency: this.stats.latency,
      admission: { queued: this.admission.size, wait: this.stats.admissionWait, rejected: this.stats.rejected() },
      history: withHistory ? this.history.points(now) : [],
      now,
    };
  }

  // ---- active health ----------------------------------------------------------------

  /**
   * Runs the jobs due — probes of every node's health path, polls of every node's /metrics — then
   * re-arms itself for the next one (alarm-schedule.ts). Routing never waits for it: a slow node
   * holds only its own probe or poll, within their timeouts.
   */
  override async alarm(): Promise<void> {
    const cluster = this.cluster;
    if (!cluster) return;
    const jobs = this.schedule.take(periodsOf(cluster), Date.now());
    await Promise.all([jobs.includes("probe") ? this.probeAll(cluster) : null, jobs.includes("poll") ? this.pollAll(cluster) : null]);
    const now = Date.now();
    this.sweep(now);
    this.checkpointCursors();
    this.sample(now);
    this.admitWaiting();
    await this.ctx.storage.setAlarm(this.schedule.next());
  }

  private async probeAll(cluster: Cluster): Promise<void> {
    const s = cluster.health;
    const { path, timeoutMs } = probeSettings(cluster);
    await Promise.all(
      cluster.nodes.map(async (n) => {
        const ok = await probeNode(this.env as unknown as Record<string, unknown>, n, path, timeoutMs);
        const h = this.health.get(n.id);
        if (!h) return;
        const wasUp = h.probeUp;
        onProbe(h, ok, Date.now(), s);
        // back after its probes failed: most likely restarted, with an empty prefix cache (llm-d#2853)
        if (!wasUp && h.probeUp) this.forgetPrefixes(n.id, "probes_recovered");
      }),
    );
  }

  /** Each node's /metrics: a reading that answered replaces the last; a failure keeps it, to go stale. */
  private async pollAll(cluster: Cluster): Promise<void> {
    const { intervalMs } = signalsOf(cluster);
    const timeoutMs = Math.max(1, Math.min(2_000, Math.floor(intervalMs / 2)));
    await Promise.all(
      cluster.nodes.map(async (n) => {
        const reading = await pollEngineMetrics(this.env as unknown as Record<string, unknown>, n, timeoutMs);
        if (reading && this.health.get(n.id)) this.signals.record(n.id, reading, Date.now());
      }),
    );
  }

  // ---- internals ----------------------------------------------------------------------

  private syncCluster(view: ClusterView): void {
    if (this.cluster?.version === view.version) return;
    this.applyCluster(view);
    this.ctx.storage.sql.exec(`INSERT INTO kv (key, value) VALUES ('cluster', ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value`, JSON.stringify(view));
    void this.ensureAlarm();
  }

  private applyCluster(view: ClusterView): void {
    this.cluster = view;
    // Nodes removed from the document are forgotten (their leases still release normally).
    for (const id of this.health.sync(new Set(view.nodes.map((n) => n.id)))) {
      this.prefixIndex.prefill.forget(id);
      this.prefixIndex.decode.forget(id);
      this.recent.forget(id);
      this.leases.forget(id);
      this.signals.forget(id);
      this.charsPerToken.forget(id);
      this.cacheFeedback.forget(id);
    }
    this.schedule.configure(periodsOf(view), Date.now());
    // new nodes or thresholds may admit requests that wait
    if (this.admission.size > 0) queueMicrotask(() => this.admitWaiting());
  }

  /** The alarm fires for the earliest job due: a new document's periods move it sooner or later at once. */
  private async ensureAlarm(): Promise<void> {
    const current = await this.ctx.storage.getAlarm();
    const next = this.schedule.next();
    if (this.cluster && current !== next) await this.ctx.storage.setAlarm(next);
  }

  private candidate(n: ViewNode, role: Role, now: number): CandidateNode {
    const h = this.health.view(n.id);
    const load = this.leases.loadOf(n.id);
    return {
      // P's signals weigh nowhere in its ranking; conditional disaggregation reads its queue (prefill_busy)
      signals: this.signalView(n.id, now),
      id: n.id,
      weight: n.weight,
      group: n.group ?? `node:${n.id}`,
      load: load ? load[role] : 0,
      work: role === "prefill" ? (load?.prefillTokens ?? 0) : (load?.tokens ?? 0),
      charsPerToken: this.charsPerToken.of(n.id),
      localPrefill: n.localPrefill === true,
      healthy: isHealthy(h, now),
      drain: n.drain,
      lastFailureAt: h.lastFailureAt,
      recent: this.recent.of(n.id, role),
      recentRequests: this.recent.requestsOf(n.id, role),
    };
  }

  /** A request was routed to the node: in half-open, it is the one trial. */
  private picked(node: string, now: number): void {
    const h = this.health.get(node);
    if (h) onPicked(h, now);
  }

  private applyOutcome(report: LegReport, now: number): void {
    const h = this.health.get(report.node);
    const s = this.cluster?.health;
    if (!h || !s) return;
    if (report.outcome === "ok" || report.outcome === "client_error") onSuccess(h);
    else if (report.outcome === "failure") onFailure(h, now, s);
    else onInconclusive(h);
  }

  /** Records that `node` holds the prompt's blocks, in the index of every pool it is a candidate of. */
  private recordPrefix(hashes: string[], node: string, maxBlocks: number, pools: Record<Role, CandidateNode[]>): void {
    for (const role of ["prefill", "decode"] as const) {
      if (pools[role].some((n) => n.id === node)) this.prefixIndex[role].record(hashes, node, maxBlocks);
    }
  }

  /** Drops what the indexes believe the node holds (its cache is gone). */
  private forgetPrefixes(node: string, why: "cache_lost" | "probes_recovered"): void {
    this.prefixIndex.prefill.forget(node);
    this.prefixIndex.decode.forget(node);
    console.warn(JSON.stringify({ event: "prefix_cache_forgotten", node, reason: why }));
  }

  /**
   * Cache-hit feedback: the engine that prefilled answered `usage`. Its prompt tokens teach the
   * node's characters per token; its cached tokens are counted against the prediction the lease
   * kept, and a run of answers that found nothing of well-predicted prefixes drops the node's
   * index entries (keeping this prompt, which it has just computed).
   */
  private learnFromAnswer(leaseId: string, usage: EngineUsage): void {
    const lease = this.leases.get(leaseId);
    if (!lease) return;
    const rate = this.charsPerToken.of(usage.node);
    if (lease.promptChars) this.charsPerToken.observe(usage.node, lease.promptChars, usage.promptTokens);
    const prediction = lease.prediction;
    if (!prediction || prediction.node !== usage.node) return;
    const outcome = this.cacheFeedback.report(prediction, usage, rate);
    if (!outcome.cacheLost || !this.cluster) return;
    this.forgetPrefixes(usage.node, "cache_lost");
    const serves = (role: Role) => this.cluster!.nodes.some((n) => n.id === usage.node && (n.role === role || n.role === "both"));
    for (const role of ["prefill", "decode"] as const) {
      if (serves(role)) this.prefixIndex[role].record(prediction.hashes, usage.node, prediction.hashes.length);
    }
  }

  /** Expired leases are released, so a request whose release was lost cannot leak load. */
  private sweep(now: number, force = false): void {
    if (!force && now - this.lastSweep < SWEEP_EVERY_MS) return;
    this.lastSweep = now;
    for (const [id, lease] of this.leases.expire(now)) {
      // Its request stopped renewing without finishing (the runtime dropped it): count and log
      // it here, the one place that still knows it.
      const unconfirmed = this.reservations.delete(id);
      this.stats.expiredLeases++;
      this.stats.countRequest(lease.route, 499);
      this.freed(lease);
      console.warn(
        JSON.stringify({
          event: unconfirmed ? "reservation_expired" : "lease_expired",
          requestId: lease.requestId,
          leaseId: id,
          prefill: lease.prefill,
          decode: lease.decode,
          model: lease.model,
        }),
      );
    }
  }

  /** A decode lease ended: the projection frees its tokens, and a waiting request may fit now. */
  private freed(lease: NodeLease): void {
    this.signals.released(lease.decode, lease.tokens);
    if (this.admission.size > 0) queueMicrotask(() => this.admitWaiting());
  }

  /** The node's signals as routing uses them: projected, or null when stale or never polled. */
  private signalView(node: string, now: number): NodeSignals | null {
    if (!this.cluster) return null;
    const v = this.signals.view(node, now, signalsOf(this.cluster).staleMs);
    return v ? { kvUsage: v.kvUsage, queue: v.queue, ageMs: v.ageMs, kvCapacityTokens: v.reported.kvCapacityTokens } : null;
  }

  private signalsStatus(n: ViewNode, now: number): NodeSignalsStatus | null {
    const last = this.signals.last(n.id);
    if (!last || !this.cluster) return null;
    const s = signalsOf(this.cluster);
    const view = this.signals.view(n.id, now, s.staleMs);
    const decodes = n.role === "decode" || n.role === "both";
    const projected = view ? { kvUsage: view.kvUsage, queue: view.queue } : null;
    return {
      ...last.reading,
      at: last.at,
      ageMs: Math.max(0, now - last.at),
      projected,
      busy: decodes && view !== null && isBusy({ signals: view }, s),
    };
  }

  /**
   * Offers the waiting requests, oldest first, what the nodes can take now; expires those whose
   * time ran out (503 cluster_busy). An admitted request's lease is a reservation until its
   * Worker confirms it.
   */
  private admitWaiting(): void {
    const cluster = this.cluster;
    const now = Date.now();
    this.sweep(now, this.reservations.size > 0);
    // confirmed, released or expired: no longer a reservation to watch
    for (const [id, until] of this.reservations) if (until <= now || !this.leases.get(id)) this.reservations.delete(id);
    const retryAfterS = cluster ? Math.max(1, Math.ceil(signalsOf(cluster).intervalMs / 1000)) : 1;
    for (const w of this.admission.expire(now)) {
      this.stats.countRejected("timeout");
      w.item.answer({ ok: false, error: { kind: "cluster_busy", reason: "timeout", retryAfterS } });
    }
    // Requests for the same model see the same decode nodes: once one is refused in this pass, the
    // rest are too (a pinned request depends on its own node, so it is always tried).
    const refused = new Set<string>();
    this.admission.admit((w) => {
      if (!cluster || cluster.version !== w.item.req.version) {
        w.item.answer({ ok: false, error: { kind: "stale_view" } });
        return true;
      }
      const alike = w.item.req.pinned ? null : w.item.req.model;
      if (alike !== null && refused.has(alike)) return false;
      const routed = this.decide(w.item.req, cluster, now, true);
      if (!routed.ok && routed.error.kind === "decode_busy") {
        if (alike !== null) refused.add(alike);
        return false;
      }
      const queuedMs = now - w.enqueuedAt;
      if (routed.ok && routed.leaseId) {
        const until = now + Math.min(ADMISSION_RESERVATION_MS, this.leases.ttlMs);
        const lease = this.leases.get(routed.leaseId);
        if (lease) lease.expiresAt = until;
        this.reservations.set(routed.leaseId, until);
      }
      this.stats.observeAdmissionWait(queuedMs);
      w.item.answer(routed.ok ? { ...routed, queuedMs } : routed);
      return true;
    });
    this.armWake();
  }

  /** One timer for the next thing that needs the object without a call: a queue deadline, a reservation's end. */
  private armWake(): void {
    clearTimeout(this.wakeTimer);
    const deadlines = [...this.reservations.values()];
    const queueDeadline = this.admission.nextDeadline();
    if (queueDeadline !== null) deadlines.push(queueDeadline);
    if (deadlines.length === 0) return;
    const at = Math.min(...deadlines);
    this.wakeTimer = setTimeout(() => this.admitWaiting(), Math.max(0, at - Date.now()) + 5);
  }

  /** One point of per-node figures for the status page's history. */
  private sample(now: number): void {
    const cluster = this.cluster;
    if (!cluster || now - this.lastSample < HISTORY_EVERY_MS) return;
    this.lastSample = now;
    const staleMs = signalsOf(cluster).staleMs;
    this.history.add({
      t: now,
      nodes: cluster.nodes.map((n) => {
        const load = this.leases.loadOf(n.id);
        const view = this.signals.view(n.id, now, staleMs);
        return { node: n.id, inflight: (load?.prefill ?? 0) + (load?.decode ?? 0), kvUsage: view?.reported.kvUsage ?? null, queue: view?.reported.waiting ?? null };
      }),
    });
  }

  private checkpointCursors(): void {
    for (const { role, value } of this.cursors.unsaved()) {
      this.ctx.storage.sql.exec(`INSERT INTO cursor (pool, value) VALUES (?, ?) ON CONFLICT(pool) DO UPDATE SET value = excluded.value`, role, value);
      this.cursors.saved(role, value);
    }
  }
}

const signalsOf = (c: Cluster): SignalSettings => c.signals ?? DEFAULT_SIGNALS;
const admissionOf = (c: Cluster): AdmissionSettings => c.admission ?? DEFAULT_ADMISSION;
const periodsOf = (c: Cluster): Record<AlarmJob, number> => ({ probe: c.health.intervalMs, poll: signalsOf(c).intervalMs });

const slimRole = (d: Decision["prefill"]): Decision["prefill"] => ({ id: d.id, rule: d.rule, failOpen: d.failOpen, candidates: [], fallbacks: [] });
const slimDecision = (d: Decision): Decision => ({
  prefill: slimRole(d.prefill),
  decode: slimRole(d.decode),
  cursors: d.cursors,
  mode: d.mode,
  reason: d.reason,
  tokens: d.tokens,
});
