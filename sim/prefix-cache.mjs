// Per-node prefix KV cache of a simulated engine: chained block hashes (like vLLM's
// prefix caching) kept in an LRU bounded by a number of blocks.
import { createHash } from 'node:crypto';

/**
 * Hashes of the FULL blocks of a prompt, chained: block k's hash covers blocks 0..k, so two
 * prompts share their first k hashes exactly when they share their first k blocks.
 * @param {string | number[]} units prompt text (characters) or token ids
 * @param {number} unitsPerBlock characters (or token ids) per block
 * @returns {string[]} one hex hash per full block (a trailing partial block is not hashed)
 */
export function chainedBlockHashes(units, unitsPerBlock) {
  if (!(unitsPerBlock > 0)) throw new RangeError('unitsPerBlock must be > 0');
  const fullBlocks = Math.floor(units.length / unitsPerBlock);
  /** @type {string[]} */
  const hashes = [];
  let previous = '';
  for (let k = 0; k < fullBlocks; k++) {
    const slice = units.slice(k * unitsPerBlock, (k + 1) * unitsPerBlock);
    const text = typeof slice === 'string' ? slice : JSON.stringify(slice);
    previous = createHash('sha256').update(previous).update('\u0000').update(text).digest('hex').slice(0, 32);
    hashes.push(previous);
  }
  return hashes;
}

/**
 * LRU set of block hashes with a capacity in blocks. A chain is touched from its last block
 * to its first, so when memory runs short the tail of a prefix goes before its head (a head
 * without its tail still gives hits; a tail without its head gives none).
 */
export class PrefixCache {
  /** @param {number} capacityBlocks */
  constructor(capacityBlocks) {
    if (!(capacityBlocks >= 0)) throw new RangeError('capacityBlocks must be >= 0');
    this.capacityBlocks = capacityBlocks;
    /** @type {Map<string, true>} insertion order = LRU order, oldest first */
    this.blocks = new Map();
    this.evictions = 0;
  }

  get size() {
    return this.blocks.size;
  }

  /** @param {string} hash */
  has(hash) {
    return this.blocks.has(hash);
  }

  /**
   * Number of leading blocks of the chain held here; the hits are marked recently used.
   * @param {string[]} hashes
   */
  match(hashes) {
    let hit = 0;
    while (hit < hashes.length && this.blocks.has(hashes[hit])) hit++;
    this.#touch(hashes.slice(0, hit));
    return hit;
  }

  /**
   * Leading blocks held, without touching the LRU order.
   * @param {string[]} hashes
   */
  peekMatch(hashes) {
    let hit = 0;
    while (hit < hashes.length && this.blocks.has(hashes[hit])) hit++;
    return hit;
  }

  /**
   * Insert (or refresh) every block of the chain, evicting least recently used blocks.
   * @param {string[]} hashes
   */
  insert(hashes) {
    this.#touch(hashes);
    while (this.blocks.size > this.capacityBlocks) {
      const oldest = this.blocks.keys().next().value;
      if (oldest === undefined) break;
      this.blocks.delete(oldest);
      this.evictions++;
    }
  }

  /** Block hashes, least recently used first. */
  keys() {
    return [...this.blocks.keys()];
  }

  clear() {
    this.blocks.clear();
    this.evictions = 0;
  }

  /** @param {string[]} hashes */
  #touch(hashes) {
    for (let i = hashes.length - 1; i >= 0; i--) {
      this.blocks.delete(hashes[i]);
      this.blocks.set(hashes[i], true);
    }
  }
}
