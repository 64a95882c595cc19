import type { Role } from "../routing/types";

/**
 * Requests recently routed to each node, per role, decayed by one request's worth on every routed
 * request (half-life in requests): cache_aware's share bound and the tie-breaks read it.
 */
export class RecentShare {
  readonly #byNode = new Map<string, { prefill: number; decode: number }>();

  of(node: string, role: Role): number {
    return this.#byNode.get(node)?.[role] ?? 0;
  }

  /** Decays every node's count by one request and counts this one (no P: colocated). */
  count(prefill: string | null, decode: string, halfLife: number): void {
    const decay = 0.5 ** (1 / halfLife);
    for (const r of this.#byNode.values()) {
      if (prefill) r.prefill *= decay;
      r.decode *= decay;
    }
    if (prefill) this.#bump(prefill, "prefill");
    this.#bump(decode, "decode");
  }

  forget(node: string): void {
    this.#byNode.delete(node);
  }

  clear(): void {
    this.#byNode.clear();
  }

  #bump(node: string, role: Role): void {
    const r = this.#byNode.get(node) ?? { prefill: 0, decode: 0 };
    r[role] += 1;
    this.#byNode.set(node, r);
  }
}
