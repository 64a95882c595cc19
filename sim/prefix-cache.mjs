// Chained block hashes of a prompt (like vLLM's prefix caching): the keys under which an engine's
// KV memory (sim/model/kv-memory.mjs) keeps the prefix cache.
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
