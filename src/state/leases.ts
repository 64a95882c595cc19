import { prefillContextFactor } from "../routing/predict";
import type { Decision, PdMode, Role } from "../routing/types";
import { BoundedMap } from "./bounded-map";
import type { CachePrediction } from "./cache-feedback";
import type { RouteRequest } from "./types";

/**
 * One routed request's hold on its nodes: load counted on P while its leg runs, on D until it
 * ends. A local prefill (conditional disaggregation) holds D in both parts: its prefill work until
 * D's first byte, its KV until the end.
 */
export interface NodeLease {
  /** P while its prefill leg runs (D itself for a local prefill); cleared when P answered */
  prefill: string | null;
  decode: string;
  /** KV tokens D holds: the prompt's tokens on D */
  tokens: number;
  /** prefill work: the prompt's tokens the prefilling node was predicted not to hold */
  prefillTokens?: number;
  /** how it is served (a local prefill's decode failover moves its prefill part too) */
  mode?: PdMode;
  /** what the router predicted the prefilling node held, for the engine's answer to be compared with */
  prediction?: CachePrediction;
  /** characters of the prompt's canonical text (learning each node's characters per token); 0: unknown */
  promptChars?: number;
  expiresAt: number;
  /** the route's metric label and the request's id, for a lease that expires unreleased */
  route: string;
  requestId?: string | undefined;
  fallbacks: { prefill: string[]; decode: string[] };
  model: string;
  /** what the learned rates and routing precision need when the request ends (node-rates.ts) */
  timing?: LeaseTiming;
}

/** A routed request's figures for learning each node's rates from its legs (node-rates.ts). */
export interface LeaseTiming {
  /** the node that prefills: P when disaggregated, else D */
  prefiller: string;
  /** prefill work already running on it when the request was routed: its cost, in tokens at context 0 (NodeLoad.prefillCost) */
  aheadCost: number;
  /** the prompt's tokens and those the prefilling node was predicted to hold (the engine's answer replaces them) */
  promptTokens: number;
  predictedCached: number;
  /** tokens D was predicted to lack: the KV it pulls */
  transferTokens: number;
  /** predicted disaggregation's TTFT (ms), for actual / predicted */
  predictedTtftMs?: number;
  /** P's answer (ms), once it came */
  prefillMs?: number;
  /** the conversation's affinity key (routing precision) */
  key: string | null;
}

/** The timing of a request routed as `decision`, with prefills of `aheadCost` running on its prefilling node. */
export function leaseTimings(req: RouteRequest, decision: Decision, aheadCost: number): LeaseTiming {
  const t = decision.tokens;
  const disaggregated = decision.mode === "disaggregated";
  return {
    prefiller: disaggregated ? decision.prefill.id : decision.decode.id,
    aheadCost,
    promptTokens: t.prompt,
    predictedCached: Math.max(0, t.prompt - t.prefillWork),
    transferTokens: disaggregated ? (t.uncachedOnDecode ?? t.prompt) : 0,
    ...(decision.predictedTtftMs !== undefined ? { predictedTtftMs: decision.predictedTtftMs } : {}),
    key: req.key,
  };
}

/** In-flight load of one node, and how many requests it was ever given per role. */
export interface NodeLoad {
  prefill: number;
  decode: number;
  /** estimated prompt tokens of the decode streams open on it (KV tokens held) */
  tokens: number;
  /** uncached prompt tokens of the prefills running on it (prefill work) */
  prefillTokens: number;
  /**
   * the same prefills' cost, in tokens at context 0: each one's tokens times attention over its own
   * context (predict.ts prefillContextFactor), so a queued 80k-token prompt weighs what it takes
   */
  prefillCost: number;
  requestsPrefill: number;
  requestsDecode: number;
  /** decode leases on it whose P (another node) has not answered yet, and their KV tokens: under the await protocol its engine has not got them */
  awaiting: number;
  awaitingTokens: number;
  /**
   * the prompt tokens of the prefill legs it runs as another request's P, until P answered: KV its
   * engine holds for them (P keeps a prompt's blocks for D to pull), which on a `both` node fills
   * the same memory its decodes use
   */
  prefillKvTokens: number;
}

export const newLoad = (): NodeLoad => ({
  prefill: 0,
  decode: 0,
  tokens: 0,
  prefillTokens: 0,
  prefillCost: 0,
  requestsPrefill: 0,
  requestsDecode: 0,
  awaiting: 0,
  awaitingTokens: 0,
  prefillKvTokens: 0,
});
/**
 * The KV tokens the router's leases keep on a node: the prompts it decodes and, as another request's
 * P, those it prefills until P answered (on a `both` node, the same memory). The floor of its
 * projected KV use (engine-signals.ts projectSignals).
 */
export const leaseKvTokens = (load: NodeLoad | undefined): number => (load ? load.tokens + load.prefillKvTokens : 0);

const prefillWorkOf = (lease: NodeLease): number => lease.prefillTokens ?? 0;
/** A lease's prefill work at context 0: its uncached tokens over the part of its prompt cached before them. */
export const prefillCostOf = (lease: NodeLease): number => {
  const work = prefillWorkOf(lease);
  return work * prefillContextFactor(Math.max(0, lease.tokens - work) + work / 2);
};

/**
 * A lease expires this long after it was taken or last renewed (LEASE_TTL_MS var): a live
 * request renews it every third of that, so a long stream keeps counting as load while a
 * request that died without releasing stops counting soon.
 */
export const DEFAULT_LEASE_TTL_MS = 60_000;

/** The LEASE_TTL_MS var of the object's env, when it is a positive number. */
export function leaseTtlMsOf(env: unknown): number {
  const ttl = Number((env as { LEASE_TTL_MS?: string } | undefined)?.LEASE_TTL_MS);
  return Number.isFinite(ttl) && ttl > 0 ? ttl : DEFAULT_LEASE_TTL_MS;
}

/** released before their route call arrived; remembered this many at most */
const TOMBSTONES = 10_000;
/** expired leases are looked for at most this often (every route call would be wasteful) */
const SWEEP_EVERY_MS = 1_000;

/**
 * The lease of a request just routed: P holds its prefill work (D itself for a local prefill, nobody
 * colocated), D the prompt's KV tokens; the fallbacks are kept here for failover.
 */
export function routedLease(req: RouteRequest, decision: Decision, colocated: boolean, expiresAt: number, prediction: CachePrediction | undefined): NodeLease {
  const d = decision.decode.id;
  return {
    prefill: colocated ? null : decision.prefill.rule === "local_prefill" ? d : decision.prefill.id,
    decode: d,
    tokens: decision.tokens.prompt > 0 ? decision.tokens.prompt : req.tokens,
    prefillTokens: decision.tokens.prefillWork,
    mode: decision.mode,
    ...(prediction ? { prediction } : {}),
    promptChars: req.promptChars ?? 0,
    expiresAt,
    route: req.route ?? "other",
    requestId: req.requestId,
    fallbacks: { prefill: [...decision.prefill.fallbacks], decode: [...decision.decode.fallbacks] },
    model: req.model,
  };
}

/** The log line of a lease that expired unreleased (`unconfirmed`: admitted from the queue, its Worker never confirmed it). */
export const expiredLeaseLog = (id: string, lease: NodeLease, unconfirmed: boolean) => ({
  event: unconfirmed ? "reservation_expired" : "lease_expired",
  requestId: lease.requestId,
  leaseId: id,
  prefill: lease.prefill,
  decode: lease.decode,
  model: lease.model,
});

/**
 * The leases of routed requests and the per-node load they add up to. Plain data with the clock
 * passed in: a lease lives `ttlMs` after it was taken or renewed, so a request that died without
 * releasing stops counting soon (`expired`), while a live one renews it.
 */
export class LeaseTable {
  readonly #leases = new Map<string, NodeLease>();
  readonly #load = new Map<string, NodeLoad>();
  /** leases released before their route call arrived (the client left mid-call): never taken */
  readonly #released = new BoundedMap<number>(TOMBSTONES);
  #next = 0;
  #lastSweep = 0;

  constructor(readonly ttlMs: number) {}

  get size(): number {
    return this.#leases.size;
  }

  get(id: string): NodeLease | undefined {
    return this.#leases.get(id);
  }

  loadOf(node: string): NodeLoad | undefined {
    return this.#load.get(node);
  }

  /** An id for a lease whose request did not choose one. */
  newId(now: number): string {
    return `${now.toString(36)}-${(this.#next++).toString(36)}`;
  }

  /** Takes a lease: P (if any) and D each count one more request; P its prefill work, D its KV tokens. */
  take(id: string, lease: NodeLease): void {
    this.#leases.set(id, lease);
    if (lease.prefill) this.#add(lease.prefill, "prefill", prefillWorkOf(lease), prefillCostOf(lease));
    this.#add(lease.decode, "decode", lease.tokens, 0);
    this.#awaiting(lease, 1);
  }

  /** The request still runs: its lease lives another TTL. False when it is gone. */
  renew(id: string, now: number): boolean {
    return this.expireAt(id, now + this.ttlMs);
  }

  /** The lease lives until `at` (an admitted request's, unless renewed: a reservation). False when it is gone. */
  expireAt(id: string, at: number): boolean {
    const lease = this.#leases.get(id);
    if (lease) lease.expiresAt = at;
    return lease !== undefined;
  }

  /** P answered: its part of the lease ends. True when `node` held it. */
  endPrefill(id: string, node: string): boolean {
    const lease = this.#leases.get(id);
    if (lease?.prefill !== node) return false;
    this.#awaiting(lease, -1);
    this.#remove(node, "prefill", prefillWorkOf(lease), prefillCostOf(lease));
    lease.prefill = null;
    return true;
  }

  /** The lease's `role` moves to `next` (failover). Returns the node it left, or undefined without a lease. */
  move(id: string, role: Role, next: string): { from: string | null } | undefined {
    const lease = this.#leases.get(id);
    if (!lease) return undefined;
    const from = role === "prefill" ? lease.prefill : lease.decode;
    const tokens = role === "decode" ? lease.tokens : prefillWorkOf(lease);
    const cost = role === "decode" ? 0 : prefillCostOf(lease);
    this.#awaiting(lease, -1);
    if (from) this.#remove(from, role, tokens, cost);
    this.#add(next, role, tokens, cost);
    if (role === "prefill") lease.prefill = next;
    else lease.decode = next;
    this.#awaiting(lease, 1);
    return { from };
  }

  /**
   * Failover: the lease's `role` moves to the first of its fallbacks `mayTake` accepts, dropping
   * those ranked before it; a local prefill moves with its D (the next D prefills it). Null without
   * a lease or a fallback to take.
   */
  failover(id: string, role: Role, mayTake: (node: string) => boolean): { lease: NodeLease; from: string | null; next: string; prefill?: string } | null {
    const lease = this.#leases.get(id);
    if (!lease) return null;
    const candidates = lease.fallbacks[role];
    const at = candidates.findIndex((node) => mayTake(node));
    if (at < 0) return null;
    const next = candidates[at]!;
    lease.fallbacks[role] = candidates.slice(at + 1);
    const from = this.move(id, role, next)!.from;
    if (role === "decode" && lease.mode === "local" && lease.prefill !== null && lease.prefill === from) {
      // D prefilled alone and failed: the request goes P then D (its fallbacks.prefill: the P/D path)
      const p = lease.fallbacks.prefill.find((node) => mayTake(node));
      if (p === undefined) this.move(id, "prefill", next);
      else {
        lease.fallbacks.prefill = lease.fallbacks.prefill.filter((node) => node !== p);
        this.move(id, "prefill", p);
        lease.mode = "disaggregated";
        return { lease, from, next, prefill: p };
      }
    }
    return { lease, from, next };
  }

  /** Releases a lease once; the released lease, or null when it is not (or no longer) held. */
  release(id: string): NodeLease | null {
    const lease = this.#leases.get(id);
    if (!lease) return null;
    this.#leases.delete(id);
    this.#awaiting(lease, -1);
    if (lease.prefill) this.#remove(lease.prefill, "prefill", prefillWorkOf(lease), prefillCostOf(lease));
    this.#remove(lease.decode, "decode", lease.tokens, 0);
    return lease;
  }

  /** Remembers that `id` was released before it was taken, until a TTL from now. */
  tombstone(id: string, now: number): void {
    this.#released.remember(id, now + this.ttlMs);
  }

  /** True (and forgotten) when `id` was released before its route call arrived. */
  consumeTombstone(id: string): boolean {
    return this.#released.delete(id);
  }

  /** Whether to look for expired leases now: at most once a second, unless `force`. */
  sweepDue(now: number, force = false): boolean {
    if (!force && now - this.#lastSweep < SWEEP_EVERY_MS) return false;
    this.#lastSweep = now;
    return true;
  }

  /** Releases and returns the leases whose time ran out; drops old tombstones. */
  expire(now: number): Array<[string, NodeLease]> {
    const out: Array<[string, NodeLease]> = [];
    for (const [id, lease] of this.#leases) {
      if (lease.expiresAt > now) continue;
      this.release(id);
      out.push([id, lease]);
    }
    for (const [id, until] of [...this.#released.entries()]) if (until <= now) this.#released.delete(id);
    return out;
  }

  /** The node left the document: forget its counters once nothing is in flight on it. */
  forget(node: string): void {
    const load = this.#load.get(node);
    if (load && load.prefill === 0 && load.decode === 0) this.#load.delete(node);
  }

  /** Counts (+1) or uncounts (-1) the lease on its D as awaiting its P, and its prompt's KV on that P, when it is. */
  #awaiting(lease: NodeLease, sign: 1 | -1): void {
    if (lease.prefill === null || lease.prefill === lease.decode) return;
    const p = this.#load.get(lease.prefill);
    if (p) p.prefillKvTokens = Math.max(0, p.prefillKvTokens + sign * lease.tokens);
    const load = this.#load.get(lease.decode);
    if (!load) return;
    load.awaiting = Math.max(0, load.awaiting + sign);
    load.awaitingTokens = Math.max(0, load.awaitingTokens + sign * lease.tokens);
  }

  #add(node: string, role: Role, tokens: number, cost: number): void {
    const load = this.#load.get(node) ?? newLoad();
    this.#load.set(node, load);
    load[role] += 1;
    if (role === "prefill") {
      load.prefillTokens += tokens;
      load.prefillCost += cost;
      load.requestsPrefill += 1;
    } else {
      load.tokens += tokens;
      load.requestsDecode += 1;
    }
  }

  #remove(node: string, role: Role, tokens: number, cost: number): void {
    const load = this.#load.get(node);
    if (!load) return;
    load[role] = Math.max(0, load[role] - 1);
    if (role === "prefill") {
      load.prefillTokens = Math.max(0, load.prefillTokens - tokens);
      load.prefillCost = load[role] === 0 ? 0 : Math.max(0, load.prefillCost - cost);
    } else load.tokens = Math.max(0, load.tokens - tokens);
  }
}
