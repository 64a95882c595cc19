import type { Role } from "../routing/types";
import { BoundedMap } from "./bounded-map";

/** One routed request's hold on its nodes: load counted on P while its leg runs, on D until it ends. */
export interface NodeLease {
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

/** In-flight load of one node, and how many requests it was ever given per role. */
export interface NodeLoad {
  prefill: number;
  decode: number;
  /** estimated prompt tokens of the decode streams open on it */
  tokens: number;
  requestsPrefill: number;
  requestsDecode: number;
}

const newLoad = (): NodeLoad => ({ prefill: 0, decode: 0, tokens: 0, requestsPrefill: 0, requestsDecode: 0 });

/** released before their route call arrived; remembered this many at most */
const TOMBSTONES = 10_000;

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

  /** Takes a lease: P (if any) and D each count one more request; D also its tokens. */
  take(id: string, lease: NodeLease): void {
    this.#leases.set(id, lease);
    if (lease.prefill) this.#add(lease.prefill, "prefill", 0);
    this.#add(lease.decode, "decode", lease.tokens);
  }

  /** The request still runs: its lease lives another TTL. False when it is gone. */
  renew(id: string, now: number): boolean {
    const lease = this.#leases.get(id);
    if (!lease) return false;
    lease.expiresAt = now + this.ttlMs;
    return true;
  }

  /** P answered: its part of the lease ends. True when `node` held it. */
  endPrefill(id: string, node: string): boolean {
    const lease = this.#leases.get(id);
    if (lease?.prefill !== node) return false;
    this.#remove(node, "prefill", 0);
    lease.prefill = null;
    return true;
  }

  /** The lease's `role` moves to `next` (failover). Returns the node it left, or undefined without a lease. */
  move(id: string, role: Role, next: string): { from: string | null } | undefined {
    const lease = this.#leases.get(id);
    if (!lease) return undefined;
    const from = role === "prefill" ? lease.prefill : lease.decode;
    const tokens = role === "decode" ? lease.tokens : 0;
    if (from) this.#remove(from, role, tokens);
    this.#add(next, role, tokens);
    if (role === "prefill") lease.prefill = next;
    else lease.decode = next;
    return { from };
  }

  /** Releases a lease once; the released lease, or null when it is not (or no longer) held. */
  release(id: string): NodeLease | null {
    const lease = this.#leases.get(id);
    if (!lease) return null;
    this.#leases.delete(id);
    if (lease.prefill) this.#remove(lease.prefill, "prefill", 0);
    this.#remove(lease.decode, "decode", lease.tokens);
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

  #add(node: string, role: Role, tokens: number): void {
    const load = this.#load.get(node) ?? newLoad();
    this.#load.set(node, load);
    load[role] += 1;
    load.tokens += tokens;
    if (role === "prefill") load.requestsPrefill += 1;
    else load.requestsDecode += 1;
  }

  #remove(node: string, role: Role, tokens: number): void {
    const load = this.#load.get(node);
    if (!load) return;
    load[role] = Math.max(0, load[role] - 1);
    load.tokens = Math.max(0, load.tokens - tokens);
  }
}
