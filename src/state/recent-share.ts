import type { Role } from "../routing/types";

/**
 * Work recently routed to each node, per role, in tokens the node had to compute or bring into its
 * KV (a request counts the prompt's tokens the node was predicted not to hold, at least 1), decayed
 * on every routed request (half-life in requests): cache_aware's share bound and the tie-breaks
 * read it. Counting work rather than requests keeps the prefill tokens per node even, not only
 * the requests: a node given the long cold prompts has done more (issue 17 item 4).
 */
interface Share {
  prefill: number;
  decode: number;
  /** the same, counting requests */
  prefillRequests: number;
  decodeRequests: number;
}

export class RecentShare {
  readonly #byNode = new Map<string, Share>();

  /** decayed work (tokens) */
  of(node: string, role: Role): number {
    return this.#byNode.get(node)?.[role] ?? 0;
  }

  /** decayed requests */
  requestsOf(node: string, role: Role): number {
    const r = this.#byNode.get(node);
    return (role === "prefill" ? r?.prefillRequests : r?.decodeRequests) ?? 0;
  }

  /** Decays every node's share by one request and counts this one's work (no P: colocated). */
  count(prefill: string | null, decode: string, halfLife: number, prefillWork = 1, decodeWork = 1): void {
    const decay = 0.5 ** (1 / halfLife);
    for (const r of this.#byNode.values()) {
      if (prefill) {
        r.prefill *= decay;
        r.prefillRequests *= decay;
      }
      r.decode *= decay;
      r.decodeRequests *= decay;
    }
    if (prefill) this.#bump(prefill, "prefill", prefillWork);
    this.#bump(decode, "decode", decodeWork);
  }

  forget(node: string): void {
    this.#byNode.delete(node);
  }

  clear(): void {
    this.#byNode.clear();
  }

  #bump(node: string, role: Role, work: number): void {
    const r = this.#byNode.get(node) ?? { prefill: 0, decode: 0, prefillRequests: 0, decodeRequests: 0 };
    r[role] += Math.max(0, work);
    if (role === "prefill") r.prefillRequests += 1;
    else r.decodeRequests += 1;
    this.#byNode.set(node, r);
  }
}
