// An engine's KV memory, as vLLM's block manager keeps it (vllm/v1/core/kv_cache_manager.py,
// block_pool.py): a fixed number of blocks of `blockSize` tokens. A running request holds the
// blocks of its prompt and of the tokens it generated from admission to finish. The prefix cache
// lives in the same memory: when a request finishes, its full blocks keep their hashes and become
// free-but-reusable; a later request with the same prefix takes them back, and a new allocation
// evicts the least recently used of them. Usage, as vLLM reports it (kv_cache_usage_perc), is the
// share of blocks that running requests hold (cached-but-free blocks count as free).
//
// Prefix matching is done on coarser "cache units" of `unitTokens` tokens (512 by default: the
// chained block hashes of sim/prefix-cache.mjs, the Mooncake trace's block size), each holding
// unitTokens / blockSize blocks: vLLM matches every 16 tokens, the simulator every 512, so a prefix
// hit is rounded down to a multiple of 512 tokens. Memory itself is counted in blocks.

/**
 * @typedef {{ refs: number, ready: boolean }} Unit
 * @typedef {object} Allocation what one request holds
 * @property {string[]} hashes the units it pinned (its prompt's full units)
 * @property {number} privateBlocks blocks of tokens past its last full unit (tail and output)
 * @property {boolean} released
 * @property {number} epoch the memory's epoch when taken (a cleared memory ignores older ones)
 */

export class KvMemory {
  /**
   * @param {object} o
   * @param {number} o.numBlocks capacity in blocks (vLLM num_gpu_blocks)
   * @param {number} o.blockSize tokens a block (vLLM block_size, 16)
   * @param {number} o.unitTokens tokens a prefix-cache unit (a multiple of blockSize)
   */
  constructor({ numBlocks, blockSize, unitTokens }) {
    if (!(numBlocks >= 0 && blockSize > 0 && unitTokens > 0)) throw new RangeError('bad KV memory geometry');
    this.numBlocks = Math.floor(numBlocks);
    this.blockSize = blockSize;
    this.unitTokens = unitTokens;
    this.blocksPerUnit = Math.ceil(unitTokens / blockSize);
    /** @type {Map<string, Unit>} */
    this.units = new Map();
    /** ready units no request holds, least recently used first: the evictable prefix cache */
    /** @type {Map<string, true>} */
    this.evictable = new Map();
    /** blocks held by requests (units with refs > 0, counted once, plus private blocks) */
    this.heldBlocks = 0;
    this.evictions = 0;
    this.epoch = 0;
    /** @type {Set<() => void>} told when blocks become free (a waiting request may fit now) */
    this.listeners = new Set();
  }

  /** Blocks neither held nor cached. */
  freeBlocks() {
    return this.numBlocks - this.heldBlocks - this.evictable.size * this.blocksPerUnit;
  }

  /** Share of blocks held by requests, 0..1 (vLLM's KV cache usage). */
  usage() {
    return this.numBlocks === 0 ? 0 : this.heldBlocks / this.numBlocks;
  }

  /** Blocks held by requests plus cached ones: what the prefix cache occupies too. */
  occupiedBlocks() {
    return this.heldBlocks + this.evictable.size * this.blocksPerUnit;
  }

  /** @param {string} hash */
  has(hash) {
    return this.units.get(hash)?.ready === true;
  }

  /** Number of leading units of the chain held and computed here (no side effect). @param {string[]} hashes */
  lookup(hashes) {
    let hit = 0;
    while (hit < hashes.length && this.units.get(hashes[hit])?.ready === true) hit++;
    return hit;
  }

  /** Blocks a request of `tokens` tokens needs past its full units. @param {number} tokens @param {number} units */
  privateBlocksFor(tokens, units) {
    return Math.ceil(Math.max(0, tokens - units * this.unitTokens) / this.blockSize);
  }

  /**
   * Blocks an allocation of these units plus `tailTokens` would take from the free pool (units
   * already held by a request cost nothing; cached ones are taken back from the evictable pool).
   * @param {string[]} hashes @param {number} tailTokens
   */
  blocksNeeded(hashes, tailTokens) {
    let units = 0;
    for (const h of hashes) {
      const u = this.units.get(h);
      if (!u || u.refs === 0) units++;
    }
    return units * this.blocksPerUnit + Math.ceil(Math.max(0, tailTokens) / this.blockSize);
  }

  /** Whether a request this large could ever fit in an empty memory. @param {number} tokens */
  fitsAtAll(tokens) {
    return Math.ceil(tokens / this.blockSize) <= this.numBlocks;
  }

  /**
   * Pin the units of a prompt (taking cached ones back, allocating missing ones) plus private
   * blocks for `tailTokens`; evicts cached units as needed. Null when it does not fit: nothing
   * is taken then.
   * @param {string[]} hashes @param {number} tailTokens @returns {Allocation | null}
   */
  allocate(hashes, tailTokens) {
    const privateBlocks = Math.ceil(Math.max(0, tailTokens) / this.blockSize);
    // cached units this request takes back are no longer evictable for its own allocation
    let reclaimed = 0;
    let fresh = 0;
    for (const h of hashes) {
      const u = this.units.get(h);
      if (!u) fresh++;
      else if (u.refs === 0) reclaimed++;
    }
    const need = fresh * this.blocksPerUnit + privateBlocks;
    const available = this.freeBlocks() + (this.evictable.size - reclaimed) * this.blocksPerUnit;
    if (need > available) return null;
    for (const h of hashes) {
      const u = this.units.get(h);
      if (u) {
        if (u.refs === 0) {
          this.evictable.delete(h);
          this.heldBlocks += this.blocksPerUnit;
        }
        u.refs++;
      } else {
        this.#makeRoom(this.blocksPerUnit);
        this.units.set(h, { refs: 1, ready: false });
        this.heldBlocks += this.blocksPerUnit;
      }
    }
    this.#makeRoom(privateBlocks);
    this.heldBlocks += privateBlocks;
    return { hashes: [...hashes], privateBlocks, released: false, epoch: this.epoch };
  }

  /**
   * Grow a request's private blocks to cover `tokens` tokens in all (its sequence grew by decoding).
   * @param {Allocation} a @param {number} tokens @returns {boolean} false when memory is full
   */
  grow(a, tokens) {
    if (a.epoch !== this.epoch) return false;
    const want = this.privateBlocksFor(tokens, a.hashes.length);
    const more = want - a.privateBlocks;
    if (more <= 0) return true;
    if (more > this.freeBlocks() + this.evictable.size * this.blocksPerUnit) return false;
    this.#makeRoom(more);
    this.heldBlocks += more;
    a.privateBlocks = want;
    return true;
  }

  /** The units of an allocation now hold computed (or received) KV: later requests hit them. @param {Allocation} a */
  markReady(a) {
    if (a.epoch !== this.epoch) return;
    for (const h of a.hashes) {
      const u = this.units.get(h);
      if (u) u.ready = true;
    }
  }

  /**
   * Give back what a request held. Its computed units stay cached (evictable, the chain's tail
   * least recently used so a prefix loses its tail before its head); the rest is freed.
   * @param {Allocation} a
   */
  release(a) {
    if (a.released || a.epoch !== this.epoch) return;
    a.released = true;
    this.heldBlocks -= a.privateBlocks;
    for (let i = a.hashes.length - 1; i >= 0; i--) {
      const h = a.hashes[i];
      const u = this.units.get(h);
      if (!u) continue;
      u.refs--;
      if (u.refs > 0) continue;
      this.heldBlocks -= this.blocksPerUnit;
      if (u.ready) this.evictable.set(h, true);
      else this.units.delete(h);
    }
    for (const notify of this.listeners) notify();
  }

  /** Mark a chain recently used (a hit touched it) without holding it. @param {string[]} hashes */
  touch(hashes) {
    for (let i = hashes.length - 1; i >= 0; i--) {
      if (this.evictable.delete(hashes[i])) this.evictable.set(hashes[i], true);
    }
  }

  /**
   * Cache a chain as computed, holding nothing (as a request that allocated, computed and
   * finished would): as many units as fit.
   * @param {string[]} hashes
   */
  insertReady(hashes) {
    for (const h of hashes) {
      const u = this.units.get(h);
      if (u) {
        u.ready = true;
        continue;
      }
      this.#makeRoom(this.blocksPerUnit);
      if (this.freeBlocks() < this.blocksPerUnit) break;
      this.units.set(h, { refs: 0, ready: true });
      this.evictable.set(h, true);
    }
    this.touch(hashes);
  }

  /** Cached units (held or not), least recently used first among the evictable. */
  cachedUnits() {
    let n = 0;
    for (const u of this.units.values()) if (u.ready) n++;
    return n;
  }

  /** Forget everything (an engine reset); allocations taken before are ignored from now on. */
  clear() {
    this.units.clear();
    this.evictable.clear();
    this.heldBlocks = 0;
    this.evictions = 0;
    this.epoch++;
  }

  /** @param {number} blocks */
  #makeRoom(blocks) {
    while (this.freeBlocks() < blocks) {
      const oldest = this.evictable.keys().next().value;
      if (oldest === undefined) return;
      this.evictable.delete(oldest);
      this.units.delete(oldest);
      this.evictions++;
    }
  }
}
