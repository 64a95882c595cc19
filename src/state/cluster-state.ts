import { DurableObject } from "cloudflare:workers";
import { DocumentEditor, type DocumentEditRequest, type DocumentEditResult } from "../config/document-edit";
import { PrefixIndex } from "../routing/prefix-index";
import { selectRoute } from "../routing/select";
import type { CandidateNode, Decision, Role } from "../routing/types";
import { BoundedMap } from "./bounded-map";
import { RoundRobinCursors } from "./cursors";
import { breakerState, isHealthy, onFailure, onInconclusive, onPicked, onProbe, onSuccess, probeSettings, type ProbeSettings } from "./health";
import { NodeHealthTable } from "./health-table";
import { LeaseTable, type NodeLease } from "./leases";
import { RecentShare } from "./recent-share";
import { RouterStats } from "./router-stats";
import type { ClusterSnapshot, ClusterView, FailoverResponse, FinishReport, KeyCount, LegReport, RouteRequest, RouteResponse } from "./types";

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

type ViewNode = ClusterView["nodes"][number];

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
  private lastSweep = 0;
  private readonly documentEditor = new DocumentEditor(() => (this.env as { NODES: KVNamespace }).NODES);

  constructor(ctx: DurableObjectState, env: unknown) {
    super(ctx, env as never);
    const ttl = Number((env as { LEASE_TTL_MS?: string } | undefined)?.LEASE_TTL_MS);
    this.leases = new LeaseTable(Number.isFinite(ttl) && ttl > 0 ? ttl : DEFAULT_LEASE_TTL_MS);
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

  /** Picks P and D for one request and, unless a dry run, takes its lease: one round trip. */
  route(req: RouteRequest): RouteResponse {
    const now = Date.now();
    // The Worker sends the document's version; the view itself only when this object lacks it.
    if (req.cluster) this.syncCluster(req.cluster);
    const cluster = this.cluster;
    if (!cluster || cluster.version !== req.version) return { ok: false, error: { kind: "stale_view" } };
    this.sweep(now);
    // no model (SGLang's /generate, a tokenizer call without one): any node
    const serves = (n: ViewNode) => !n.models || !req.model || n.models.includes(req.model);
    const pool = (role: Role) => cluster.nodes.filter((n) => serves(n) && (n.role === role || n.role === "both")).map((n) => this.candidate(n, role, now));
    // one-hop requests (embeddings, tokenizer) take one node, like colocated
    const colocated = cluster.protocol === "colocated" || req.oneHop === true;
    const usesPrefix = cluster.policy.prefill === "cache_aware" || cluster.policy.decode === "cache_aware";
    const prefill = colocated ? [] : pool("prefill");
    const decode = pool("decode");
    const match = (role: Role, nodes: CandidateNode[]) =>
      usesPrefix && req.prefixHashes.length
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
    });
    if (!result.ok) return { ok: false, error: result.error };
    const decision = result.value;
    if (req.dryRun) return { ok: true, leaseId: null, decision };
    if (req.leaseId && this.leases.consumeTombstone(req.leaseId)) return { ok: true, leaseId: null, decision: slimDecision(decision) };

    this.cursors.set(decision.cursors);
    const p = decision.prefill.id;
    const d = decision.decode.id;
    for (const role of ["prefill", "decode"] as const) this.stats.countDecision(role, decision[role].rule);
    if (req.key) this.sticky.remember(req.key, { prefill: p, decode: d });
    if (usesPrefix && req.prefixHashes.length) {
      const matched = colocated ? (prefixMatches.decode[d] ?? 0) : (prefixMatches.prefill[p] ?? 0);
      this.stats.countPrefix(req.prefixHashes.length, matched);
      const maxBlocks = cluster.policy.cacheAware.maxBlocksPerRequest;
      if (!colocated) this.prefixIndex.prefill.record(req.prefixHashes, p, maxBlocks);
      this.prefixIndex.decode.record(req.prefixHashes, d, maxBlocks);
    }
    const leaseId = req.leaseId ?? this.leases.newId(now);
    const lease: NodeLease = {
      prefill: colocated ? null : p,
      decode: d,
      tokens: req.tokens,
      expiresAt: now + this.leases.ttlMs,
      route: req.route ?? "other",
      requestId: req.requestId,
      fallbacks: { prefill: [...decision.prefill.fallbacks], decode: [...decision.decode.fallbacks] },
      model: req.model,
    };
    this.leases.take(leaseId, lease);
    if (lease.prefill) this.picked(lease.prefill, now);
    this.picked(d, now);
    this.recent.count(lease.prefill, d, cluster.policy.cacheAware.shareHalfLife);
    // The request needs only the picks: candidates and fallbacks stay here (the lease keeps the fallbacks).
    return { ok: true, leaseId, decision: slimDecision(decision) };
  }

  /** The request still runs: its lease lives another TTL. False when it is gone (expired or released). */
  renew(leaseId: string): boolean {
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
    this.leases.move(leaseId, role, next);
    this.picked(next, now);
    return { next };
  }

  /** The request ended (completed, failed or aborted): release whatever the lease still holds, once. */
  finish(leaseId: string | null, report: FinishReport): void {
    const now = Date.now();
    this.stats.countRequest(report.route, report.status);
    if (report.keyLabel) this.stats.countKey(report.keyLabel);
    if (report.remember) this.sticky.remember(report.remember.key, { prefill: report.remember.prefill, decode: report.remember.decode });
    if (report.prefill) {
      this.applyOutcome(report.prefill, now);
      if (report.prefill.ms !== undefined && report.prefill.outcome === "ok") this.stats.observePrefill(report.prefill.ms);
    }
    if (report.decode) {
      this.applyOutcome(report.decode, now);
      if (report.decode.ms !== undefined && report.decode.outcome === "ok") this.stats.observeTtfb(report.decode.ms);
    }
    if (leaseId && !this.leases.release(leaseId)) this.leases.tombstone(leaseId, now);
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

  snapshot(cluster?: ClusterView): ClusterSnapshot {
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
        inflight: { prefill: c?.prefill ?? 0, decode: c?.decode ?? 0, tokens: c?.tokens ?? 0 },
        requestsTotal: { prefill: c?.requestsPrefill ?? 0, decode: c?.requestsDecode ?? 0 },
      };
    });
    return {
      version: this.cluster?.version ?? null,
      nodes,
      leases: this.leases.size,
      expiredLeases: this.stats.expiredLeases,
      requests: this.stats.requests(),
      decisions: this.stats.decisions(),
      prefix: {
        prefillEntries: this.prefixIndex.prefill.size,
        decodeEntries: this.prefixIndex.decode.size,
        maxEntries: PREFIX_INDEX_ENTRIES,
        ...this.stats.prefix,
      },
      latency: this.stats.latency,
      now,
    };
  }

  // ---- active health ----------------------------------------------------------------

  /** Probes every node's /health, then re-arms itself. Idempotent: one alarm at a time. */
  override async alarm(): Promise<void> {
    const cluster = this.cluster;
    if (!cluster) return;
    const s = cluster.health;
    const probeWith = probeSettings(cluster);
    await Promise.all(
      cluster.nodes.map(async (n) => {
        const ok = await probe(n.url, probeWith);
        const h = this.health.get(n.id);
        if (h) onProbe(h, ok, Date.now(), s);
      }),
    );
    this.sweep(Date.now());
    this.checkpointCursors();
    await this.ctx.storage.setAlarm(Date.now() + s.intervalMs);
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
    }
  }

  private async ensureAlarm(): Promise<void> {
    const current = await this.ctx.storage.getAlarm();
    if (current === null && this.cluster) await this.ctx.storage.setAlarm(Date.now() + this.cluster.health.intervalMs);
  }

  private candidate(n: ViewNode, role: Role, now: number): CandidateNode {
    const h = this.health.view(n.id);
    const load = this.leases.loadOf(n.id);
    return {
      id: n.id,
      weight: n.weight,
      group: n.group ?? `node:${n.id}`,
      load: load ? load[role] : 0,
      healthy: isHealthy(h, now),
      drain: n.drain,
      lastFailureAt: h.lastFailureAt,
      recent: this.recent.of(n.id, role),
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

  /** Expired leases are released, so a request whose release was lost cannot leak load. */
  private sweep(now: number): void {
    if (now - this.lastSweep < SWEEP_EVERY_MS) return;
    this.lastSweep = now;
    for (const [id, lease] of this.leases.expire(now)) {
      // Its request stopped renewing without finishing (the runtime dropped it): count and log
      // it here, the one place that still knows it.
      this.stats.expiredLeases++;
      this.stats.countRequest(lease.route, 499);
      console.warn(JSON.stringify({ event: "lease_expired", requestId: lease.requestId, leaseId: id, prefill: lease.prefill, decode: lease.decode, model: lease.model }));
    }
  }

  private checkpointCursors(): void {
    for (const { role, value } of this.cursors.unsaved()) {
      this.ctx.storage.sql.exec(`INSERT INTO cursor (pool, value) VALUES (?, ?) ON CONFLICT(pool) DO UPDATE SET value = excluded.value`, role, value);
      this.cursors.saved(role, value);
    }
  }
}

const slimRole = (d: Decision["prefill"]): Decision["prefill"] => ({ id: d.id, rule: d.rule, failOpen: d.failOpen, candidates: [], fallbacks: [] });
const slimDecision = (d: Decision): Decision => ({ prefill: slimRole(d.prefill), decode: slimRole(d.decode), cursors: d.cursors });

async function probe(origin: string, { path, timeoutMs }: ProbeSettings): Promise<boolean> {
  try {
    // a redirect is not a healthy node (and is never followed)
    const res = await fetch(new URL(path, origin), { signal: AbortSignal.timeout(timeoutMs), redirect: "manual" });
    await res.body?.cancel();
    return res.ok;
  } catch {
    return false;
  }
}
