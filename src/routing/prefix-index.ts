/**
 * Which nodes are believed to hold which prefix blocks (for `cache_aware`), as a bounded LRU map
 * from chained block hash to the node ids that were sent that block. Keep one index per role.
 * Plain in-memory data: the Durable Object owns an instance; nothing here is persisted.
 *
 * LRU uses Map insertion order: a touched entry is deleted and re-inserted, the first key is the
 * oldest. A request's blocks are touched tail first, so its head blocks (shared by more requests
 * and needed for any leading match at all) are the last to be evicted.
 */
/**
 * Blocks one request may add to the index (its first N; default of `policy.cacheAware
 * .maxBlocksPerRequest`). 128 blocks of 2,048 characters (~512 tokens) hold a 64k-token prompt
 * whole: that covers about 98% of the Mooncake conversation trace's prompts (p50 14 blocks, p90 54,
 * p99 167). Without a cap, a few huge unique prompts (a 10 MB body is ~5,000 blocks) would evict
 * the whole 100,000-entry index; with it, flushing takes ~800 such requests. A longer prompt also
 * leaves one entry for its end (its last block's chained hash, which stands for the whole prompt):
 * the next turn of a conversation past 64k tokens extends it, and matches through it.
 */
export const DEFAULT_MAX_BLOCKS_PER_REQUEST = 128;

/** The key of a prompt's end entry: apart from the blocks, which a match walks only from the first. */
const endKey = (hash: string): string => `end:${hash}`;

/**
 * Rough heap cost of one entry in V8/workerd: the Map slot (~40 B), the 16-hex-char key string
 * (~32 B), a small array of node-id references (~32 B + 8 B per holder; the id strings themselves
 * are shared), with slack for hash-table growth: about 150 bytes. So 100,000 entries take about
 * 15 MB of a Durable Object's 128 MB. Measured in V8 (Node 20, 100,000 entries of 16-hex hashes,
 * 24-block chains over 8 nodes): 129 bytes an entry.
 */
export class PrefixIndex {
  readonly #entries = new Map<string, string[]>();
  /** the lowest block an end entry was recorded at (Infinity: none): a match looks no lower for ends */
  #lowestEnd = Number.POSITIVE_INFINITY;
  readonly #maxEntries: number;

  constructor(maxEntries: number) {
    this.#maxEntries = Math.max(1, Math.floor(maxEntries));
  }

  get size(): number {
    return this.#entries.size;
  }

  get maxEntries(): number {
    return this.#maxEntries;
  }

  /**
   * For each of `nodeIds`, how many LEADING blocks of `hashes` it holds (counting stops at the
   * first block it lacks). Touches the blocks that some node matched.
   */
  match(hashes: readonly string[], nodeIds: readonly string[]): Record<string, number> {
    const result: Record<string, number> = {};
    for (const id of nodeIds) result[id] = 0;
    let active = [...new Set(nodeIds)];
    let matchedDepth = 0;
    for (const hash of hashes) {
      if (active.length === 0) break;
      const holders = this.#entries.get(hash);
      if (!holders) break;
      active = active.filter((id) => holders.includes(id));
      if (active.length === 0) break;
      for (const id of active) result[id] = (result[id] ?? 0) + 1;
      matchedDepth++;
    }
    for (let i = matchedDepth - 1; i >= 0; i--) {
      const hash = hashes[i] as string;
      this.#touch(hash, this.#entries.get(hash) as string[]);
    }
    this.#matchEnds(hashes, nodeIds, result);
    return result;
  }

  /**
   * A node that was sent a prompt longer than the cap holds this one through that prompt's end when
   * our chained hash at some block is that end: the latest such block counts, past the capped head.
   */
  #matchEnds(hashes: readonly string[], nodeIds: readonly string[], result: Record<string, number>): void {
    if (hashes.length <= this.#lowestEnd) return;
    let least = Math.max(this.#lowestEnd, Math.min(...nodeIds.map((id) => result[id] ?? 0)));
    for (let i = hashes.length - 1; i >= least; i--) {
      const key = endKey(hashes[i] as string);
      const holders = this.#entries.get(key);
      if (!holders) continue;
      let found = false;
      for (const id of nodeIds) {
        if (holders.includes(id) && (result[id] ?? 0) < i + 1) {
          result[id] = i + 1;
          found = true;
        }
      }
      if (!found) continue;
      this.#touch(key, holders);
      least = Math.max(this.#lowestEnd, Math.min(...nodeIds.map((id) => result[id] ?? 0)));
    }
  }

  /**
   * Remembers that `nodeId` now holds the blocks of `hashes` (it was sent that prompt): only the
   * first `maxBlocks`, so one request cannot evict more than that many entries (and one more, the
   * end of a longer prompt). Leading blocks are the ones a match can use (matching stops at the
   * first missing block); the end entry, the oldest of the request's, carries a match past them.
   */
  record(hashes: readonly string[], nodeId: string, maxBlocks: number = DEFAULT_MAX_BLOCKS_PER_REQUEST): void {
    const count = Math.min(hashes.length, Math.max(0, Math.floor(maxBlocks)));
    if (hashes.length > count && count > 0) {
      this.#hold(endKey(hashes[hashes.length - 1] as string), nodeId);
      this.#lowestEnd = Math.min(this.#lowestEnd, hashes.length - 1);
    }
    for (let i = count - 1; i >= 0; i--) this.#hold(hashes[i] as string, nodeId);
    this.#evict();
  }

  #hold(key: string, nodeId: string): void {
    const holders = this.#entries.get(key) ?? [];
    if (!holders.includes(nodeId)) holders.push(nodeId);
    this.#touch(key, holders);
  }

  /** Drops everything known about `nodeId` (it was removed, restarted or lost its cache). */
  forget(nodeId: string): void {
    for (const [hash, holders] of this.#entries) {
      const at = holders.indexOf(nodeId);
      if (at < 0) continue;
      if (holders.length === 1) this.#entries.delete(hash);
      else holders.splice(at, 1);
    }
  }

  clear(): void {
    this.#entries.clear();
    this.#lowestEnd = Number.POSITIVE_INFINITY;
  }

  /** The entry moves to the newest end of the eviction order (a Map keeps insertion order). */
  #touch(hash: string, holders: string[]): void {
    this.#entries.delete(hash);
    this.#entries.set(hash, holders);
  }

  #evict(): void {
    while (this.#entries.size > this.#maxEntries) this.#entries.delete(this.#entries.keys().next().value as string);
  }
}
