import { DurableObject } from "cloudflare:workers";
import { DocumentEditor, type DocumentEditRequest, type DocumentEditResult } from "../config/document-edit";
import { PrefixIndex } from "../routing/prefix-index";
import { selectRoute } from "../routing/select";
import type { CandidateNode, Decision, Role } from "../routing/types";
import { freshUsageDetails, noteUsageDetails, usageDetailsVerdict, usageDetailsWarning, type UsageDetailsRecord } from "../observability/usage-details";
import { breakerState, freshHealth, isHealthy, onFailure, onInconclusive, onPicked, onProbe, onSuccess, probeSettings, type NodeHealth } from "./health";
import { probeNode } from "./node-probe";
import type { ClusterSnapshot, ClusterView, FailoverResponse, FinishReport, Histogram, KeyCount, LegReport, RouteRequest, RouteResponse } from "./types";

/**
 * A lease expires this long after it was taken or last renewed (LEASE_TTL_MS var): a live
 * request renews it every third of that, so a long stream keeps counting as load while a
 * request that died without releasing stops counting soon.
 */
export const DEFAULT_LEASE_TTL_MS = 60_000;
/** per role; ~130 bytes an entry (PrefixIndex.BYTES_PER_ENTRY_ESTIMATE): ~26 MB for both */
const PREFIX_INDEX_ENTRIES = 100_000;
const STICKY_ENTRIES = 100_000;
const LATENCY_BOUNDS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120];

interface NodeLease {
  /** P while its prefill leg runs; cleared when P answered */
  prefill: string | null;
  decode: string;
  tokens: number;
  expiresAt: number;
  /** the route's metric label and the request's id, for a lease that expires unreleased */
  route: string;
  requestId?: string | undefined;
  fallbacks: { prefill: string[]; decode: string[] };
  model: string;
}

interface NodeCounters {
  prefill: number;
  decode: number;
  tokens: number;
  requestsPrefill: number;
  requestsDecode: number;
}

const newHistogram = (): Histogram => ({ bounds: LATENCY_BOUNDS, counts: LATENCY_BOUNDS.map(() => 0), sum: 0, count: 0 });

function observe(h: Histogram, ms: number): void {
  const s = ms / 1000;
  const i = h.bounds.findIndex((b) => s <= b);
  if (i >= 0) h.counts[i] = (h.counts[i] ?? 0) + 1;
  h.sum += s;
  h.count += 1;
}

/**
 * The one object that coordinates the cluster: round-robin cursors (SQLite), in-flight
 * leases, node health, the prefix index and shared counters. It gathers the inputs,
 * calls the pure selection core and applies the result; all policy lives in src/routing.
 */
export class ClusterState extends DurableObject {
  private cluster: ClusterView | null = null;
  private readonly health = new Map<string, NodeHealth>();
  private readonly counters = new Map<string, NodeCounters>();
  /** requests recently routed per node and role, decayed per routed request (cache_aware's share) */
  private readonly recent = new Map<string, { prefill: number; decode: number }>();
  private readonly leases = new Map<string, NodeLease>();
  private readonly prefixIndex = { prefill: new PrefixIndex(PREFIX_INDEX_ENTRIES), decode: new PrefixIndex(PREFIX_INDEX_ENTRIES) };
  private readonly sticky = new Map<string, { prefill: string; decode: string }>();
  private readonly requests = new Map<string, number>();
  /** requests per API key label (a short hash of the key, never the key) */
  private readonly keyRequests = new Map<string, number>();
  private readonly decisions = new Map<string, number>();
  private readonly latency = { ttfb: newHistogram(), prefill: newHistogram() };
  /** per prefill node: does it report prompt_tokens_details (observability/usage-details.ts) */
  private readonly usageDetails = new Map<string, UsageDetailsRecord>();
  private prefixStats = { lookedUpBlocks: 0, matchedBlocks: 0 };
  private cursors = { prefill: 0, decode: 0 };
  private savedCursors = { prefill: 0, decode: 0 };
  private nextLease = 0;
  /** leases released before their route call arrived (client gone mid-call): never taken */
  private readonly released = new Map<string, number>();
  private lastSweep = 0;
  private expiredLeases = 0;
  private readonly leaseTtlMs: number;
  private readonly documentEditor = new DocumentEditor(() => (this.env as { NODES: KVNamespace }).NODES);

  constructor(ctx: DurableObjectState, env: unknown) {
    super(ctx, env as never);
    const ttl = Number((env as { LEASE_TTL_MS?: string } | undefined)?.LEASE_TTL_MS);
    this.leaseTtlMs = Number.isFinite(ttl) && ttl > 0 ? ttl : DEFAULT_LEASE_TTL_MS;
    ctx.blockConcurrencyWhile(async () => {
      ctx.storage.sql.exec(`CREATE TABLE IF NOT EXISTS cursor (pool TEXT PRIMARY KEY, value INTEGER NOT NULL)`);
      ctx.storage.sql.exec(`CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL)`);
      for (const row of ctx.storage.sql.exec<{ pool: string; value: number }>(`SELECT pool, value FROM cursor`)) {
        if (row.pool === "prefill" || row.pool === "decode") this.cursors[row.pool] = this.savedCursors[row.pool] = row.value;
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
    const serves = (n: ClusterView["nodes"][number]) => !n.models || !req.model || n.models.includes(req.model);
    const pool = (role: Role) => cluster.nodes.filter((n) => serves(n) && (n.role === role || n.role === "both")).map((n) => this.candidate(n, role, now));
    // one-hop requests (embeddings, tokenizer) take one node, like colocated
    const colocated = cluster.protocol === "colocated" || req.oneHop === true;
    const usesPrefix = cluster.policy.prefill === "cache_aware" || cluster.policy.decode === "cache_aware";
    const prefill = colocated ? [] : pool("prefill");
    const decode = pool("decode");
    const prefixMatches = {
      prefill:
        usesPrefix && req.prefixHashes.length
          ? this.prefixIndex.prefill.match(
              req.prefixHashes,
              prefill.map((n) => n.id),
            )
          : {},
      decode:
        usesPrefix && req.prefixHashes.length
          ? this.prefixIndex.decode.match(
              req.prefixHashes,
              decode.map((n) => n.id),
            )
          : {},
    };
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
      cursors: { ...this.cursors },
    });
    if (!result.ok) return { ok: false, error: result.error };
    const decision = result.value;
    if (req.dryRun) return { ok: true, leaseId: null, decision };
    if (req.leaseId && this.released.delete(req.leaseId)) return { ok: true, leaseId: null, decision: slimDecision(decision) };

    this.saveCursors(decision.cursors);
    const p = decision.prefill.id;
    const d = decision.decode.id;
    for (const role of ["prefill", "decode"] as const) {
      const key = `${role}\u0000${decision[role].rule}`;
      this.decisions.set(key, (this.decisions.get(key) ?? 0) + 1);
    }
    if (req.key) this.remember(this.sticky, req.key, { prefill: p, decode: d }, STICKY_ENTRIES);
    if (usesPrefix && req.prefixHashes.length) {
      const matched = colocated ? (prefixMatches.decode[d] ?? 0) : (prefixMatches.prefill[p] ?? 0);
      this.prefixStats.lookedUpBlocks += req.prefixHashes.length;
      this.prefixStats.matchedBlocks += matched;
      const maxBlocks = cluster.policy.cacheAware.maxBlocksPerRequest;
      if (!colocated) this.prefixIndex.prefill.record(req.prefixHashes, p, maxBlocks);
      this.prefixIndex.decode.record(req.prefixHashes, d, maxBlocks);
    }
    const leaseId = req.leaseId ?? `${now.toString(36)}-${(this.nextLease++).toString(36)}`;
    const lease: NodeLease = {
      prefill: colocated ? null : p,
      decode: d,
      tokens: req.tokens,
      expiresAt: now + this.leaseTtlMs,
      route: req.route ?? "other",
      requestId: req.requestId,
      fallbacks: { prefill: [...decision.prefill.fallbacks], decode: [...decision.decode.fallbacks] },
      model: req.model,
    };
    this.leases.set(leaseId, lease);
    if (lease.prefill) this.take(lease.prefill, "prefill", 0, now);
    this.take(d, "decode", req.tokens, now);
    this.countRecent(lease.prefill, d, cluster.policy.cacheAware.shareHalfLife);
    // The request needs only the picks: candidates and fallbacks stay here (the lease keeps the fallbacks).
    return { ok: true, leaseId, decision: slimDecision(decision) };
  }

  /** The request still runs: its lease lives another TTL. False when it is gone (expired or released). */
  renew(leaseId: string): boolean {
    const lease = this.leases.get(leaseId);
    if (!lease) return false;
    lease.expiresAt = Date.now() + this.leaseTtlMs;
    return true;
  }

  /** P answered (or gave up): its part of the lease ends now, while D's goes on. */
  prefillDone(leaseId: string, report: LegReport): void {
    const now = Date.now();
    const lease = this.leases.get(leaseId);
    if (lease?.prefill === report.node) {
      this.give(report.node, "prefill", 0);
      lease.prefill = null;
    }
    this.applyOutcome(report, now);
    if (report.ms !== undefined && report.outcome === "ok") observe(this.latency.prefill, report.ms);
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
    const held = role === "prefill" ? lease.prefill : lease.decode;
    const candidates = lease.fallbacks[role];
    const nextIndex = candidates.findIndex((id) => {
      const h = this.health.get(id);
      return h !== undefined && isHealthy(h, now);
    });
    if (nextIndex < 0) return { next: null };
    const next = candidates[nextIndex]!;
    lease.fallbacks[role] = candidates.slice(nextIndex + 1);
    const tokens = role === "decode" ? lease.tokens : 0;
    if (held) this.give(held, role, tokens);
    this.take(next, role, tokens, now);
    if (role === "prefill") lease.prefill = next;
    else lease.decode = next;
    return { next };
  }

  /** The request ended (completed, failed or aborted): release whatever the lease still holds, once. */
  finish(leaseId: string | null, report: FinishReport): void {
    const now = Date.now();
    const key = `${report.route}\u0000${report.status}`;
    this.requests.set(key, (this.requests.get(key) ?? 0) + 1);
    if (report.keyLabel) this.countKey(report.keyLabel);
    if (report.usageDetails) {
      const { node, reported } = report.usageDetails;
      const record = this.usageDetails.get(node) ?? freshUsageDetails();
      this.usageDetails.set(node, record);
      if (noteUsageDetails(record, reported)) console.warn(JSON.stringify({ event: "prefill_usage_details_missing", node, message: usageDetailsWarning(node) }));
    }
    if (report.remember) this.remember(this.sticky, report.remember.key, { prefill: report.remember.prefill, decode: report.remember.decode }, STICKY_ENTRIES);
    if (report.prefill) {
      this.applyOutcome(report.prefill, now);
      if (report.prefill.ms !== undefined && report.prefill.outcome === "ok") observe(this.latency.prefill, report.prefill.ms);
    }
    if (report.decode) {
      this.applyOutcome(report.decode, now);
      if (report.decode.ms !== undefined && report.decode.outcome === "ok") observe(this.latency.ttfb, report.decode.ms);
    }
    if (leaseId && !this.release(leaseId)) this.remember(this.released, leaseId, now + this.leaseTtlMs, 10_000);
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
    const key = `${route}\u0000${status}`;
    this.requests.set(key, (this.requests.get(key) ?? 0) + 1);
    if (keyLabel) this.countKey(keyLabel);
  }

  /** Counts one authenticated request under its key label, for /metrics. */
  countKey(label: string): void {
    this.keyRequests.set(label, (this.keyRequests.get(label) ?? 0) + 1);
  }

  keyCounts(): KeyCount[] {
    return [...this.keyRequests].map(([key, count]) => ({ key, count }));
  }

  snapshot(cluster?: ClusterView): ClusterSnapshot {
    const now = Date.now();
    if (cluster) this.syncCluster(cluster);
    this.sweep(now);
    const nodes = (this.cluster?.nodes ?? []).map((n) => {
      const h = this.health.get(n.id) ?? freshHealth();
      const c = this.counters.get(n.id) ?? newCounters();
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
        inflight: { prefill: c.prefill, decode: c.decode, tokens: c.tokens },
        requestsTotal: { prefill: c.requestsPrefill, decode: c.requestsDecode },
        usageDetails: usageDetailsVerdict(this.usageDetails.get(n.id)),
      };
    });
    const split = (m: Map<string, number>) => [...m].map(([k, count]) => ({ parts: k.split("\u0000"), count }));
    return {
      version: this.cluster?.version ?? null,
      nodes,
      leases: this.leases.size,
      expiredLeases: this.expiredLeases,
      requests: split(this.requests).map(({ parts, count }) => ({ route: parts[0]!, status: Number(parts[1]), count })),
      decisions: split(this.decisions).map(({ parts, count }) => ({ role: parts[0] as Role, rule: parts[1]!, count })),
      prefix: {
        prefillEntries: this.prefixIndex.prefill.size,
        decodeEntries: this.prefixIndex.decode.size,
        maxEntries: PREFIX_INDEX_ENTRIES,
        ...this.prefixStats,
      },
      latency: this.latency,
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
        const ok = await probeNode(this.env as unknown as Record<string, unknown>, { ...n, reach: n.reach ?? {} }, probeWith);
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
    const ids = new Set(view.nodes.map((n) => n.id));
    for (const n of view.nodes) if (!this.health.has(n.id)) this.health.set(n.id, freshHealth());
    // Nodes removed from the document are forgotten (their leases still release normally).
    for (const id of [...this.health.keys()]) {
      if (!ids.has(id)) {
        this.health.delete(id);
        this.prefixIndex.prefill.forget(id);
        this.prefixIndex.decode.forget(id);
        this.recent.delete(id);
        const c = this.counters.get(id);
        if (c && c.prefill === 0 && c.decode === 0) this.counters.delete(id);
      }
    }
  }

  private async ensureAlarm(): Promise<void> {
    const current = await this.ctx.storage.getAlarm();
    if (current === null && this.cluster) await this.ctx.storage.setAlarm(Date.now() + this.cluster.health.intervalMs);
  }

  private candidate(n: ClusterView["nodes"][number], role: Role, now: number): CandidateNode {
    const h = this.health.get(n.id) ?? freshHealth();
    const c = this.counters.get(n.id);
    return {
      id: n.id,
      weight: n.weight,
      group: n.group ?? `node:${n.id}`,
      load: c ? c[role] : 0,
      healthy: isHealthy(h, now),
      drain: n.drain,
      lastFailureAt: h.lastFailureAt,
      recent: this.recent.get(n.id)?.[role] ?? 0,
    };
  }

  private take(node: string, role: Role, tokens: number, now: number): void {
    const c = this.counters.get(node) ?? newCounters();
    this.counters.set(node, c);
    c[role] += 1;
    c.tokens += tokens;
    if (role === "prefill") c.requestsPrefill += 1;
    else c.requestsDecode += 1;
    const h = this.health.get(node);
    if (h) onPicked(h, now);
  }

  /** Decays every node's recent count by one request's worth and counts this one. */
  private countRecent(prefill: string | null, decode: string, halfLife: number): void {
    const decay = 0.5 ** (1 / halfLife);
    for (const r of this.recent.values()) {
      if (prefill) r.prefill *= decay;
      r.decode *= decay;
    }
    const bump = (id: string, role: Role) => {
      const r = this.recent.get(id) ?? { prefill: 0, decode: 0 };
      r[role] += 1;
      this.recent.set(id, r);
    };
    if (prefill) bump(prefill, "prefill");
    bump(decode, "decode");
  }

  private give(node: string, role: Role, tokens: number): void {
    const c = this.counters.get(node);
    if (!c) return;
    c[role] = Math.max(0, c[role] - 1);
    c.tokens = Math.max(0, c.tokens - tokens);
  }

  /** Releases a lease once; false when it is not (or no longer) held. */
  private release(leaseId: string): boolean {
    const lease = this.leases.get(leaseId);
    if (!lease) return false;
    this.leases.delete(leaseId);
    if (lease.prefill) this.give(lease.prefill, "prefill", 0);
    this.give(lease.decode, "decode", lease.tokens);
    return true;
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
    if (now - this.lastSweep < 1_000) return;
    this.lastSweep = now;
    for (const [id, lease] of this.leases) {
      if (lease.expiresAt > now) continue;
      // Its request stopped renewing without finishing (the runtime dropped it): count and log
      // it here, the one place that still knows it.
      this.release(id);
      this.expiredLeases++;
      const key = `${lease.route}\u0000499`;
      this.requests.set(key, (this.requests.get(key) ?? 0) + 1);
      console.warn(JSON.stringify({ event: "lease_expired", requestId: lease.requestId, leaseId: id, prefill: lease.prefill, decode: lease.decode, model: lease.model }));
    }
    for (const [id, expiresAt] of this.released) if (expiresAt <= now) this.released.delete(id);
  }

  /**
   * Cursors move in memory on every request; SQLite gets them from the alarm (checkpointCursors).
   * A write here would hold every routed response behind the output gate until the write is
   * durable (~5 ms a request measured locally), and a rotation restarting a few requests back
   * after an eviction costs nothing.
   */
  private saveCursors(next: { prefill: number; decode: number }): void {
    this.cursors = { ...next };
  }

  private checkpointCursors(): void {
    for (const pool of ["prefill", "decode"] as const) {
      if (this.savedCursors[pool] === this.cursors[pool]) continue;
      this.ctx.storage.sql.exec(`INSERT INTO cursor (pool, value) VALUES (?, ?) ON CONFLICT(pool) DO UPDATE SET value = excluded.value`, pool, this.cursors[pool]);
      this.savedCursors[pool] = this.cursors[pool];
    }
  }

  private remember<V>(map: Map<string, V>, key: string, value: V, cap: number): void {
    map.delete(key);
    map.set(key, value);
    if (map.size > cap) map.delete(map.keys().next().value as string);
  }
}

const slimRole = (d: Decision["prefill"]): Decision["prefill"] => ({ id: d.id, rule: d.rule, failOpen: d.failOpen, candidates: [], fallbacks: [] });
const slimDecision = (d: Decision): Decision => ({ prefill: slimRole(d.prefill), decode: slimRole(d.decode), cursors: d.cursors });

function newCounters(): NodeCounters {
  return { prefill: 0, decode: 0, tokens: 0, requestsPrefill: 0, requestsDecode: 0 };
}
