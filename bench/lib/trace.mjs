// Mooncake-format traces: reading them, their infinite-single-cache ceiling, and prompt text
// materialised from hash ids (same id, same text), so shared block prefixes are shared text.
import { readFileSync } from 'node:fs';
import { seededText } from './text.mjs';

export const BLOCK_TOKENS = 512;
export const CHARS_PER_TOKEN = 4;
export const BLOCK_CHARS = BLOCK_TOKENS * CHARS_PER_TOKEN;

/** @typedef {{ timestamp: number, input_length: number, output_length: number, hash_ids: number[] }} TraceRequest */

/** @param {string} file @param {number} [limit] @returns {TraceRequest[]} */
export function readTrace(file, limit = Infinity) {
  /** @type {TraceRequest[]} */
  const out = [];
  for (const line of readFileSync(file, 'utf8').split('\n')) {
    if (out.length >= limit) break;
    if (line.trim()) out.push(JSON.parse(line));
  }
  return out;
}

/**
 * The hit ratio of one infinite cache shared by all requests, in file order: blocks already
 * seen before / all blocks. No router can beat it (LRU eviction and splitting only lower it).
 * @param {Iterable<{ hash_ids: number[] }>} requests
 */
export function traceCeiling(requests) {
  const seen = new Set();
  let hits = 0;
  let total = 0;
  for (const r of requests) {
    for (const id of r.hash_ids) {
      total++;
      if (seen.has(id)) hits++;
      else seen.add(id);
    }
  }
  return { hits, total, ratio: total === 0 ? 0 : hits / total };
}

/**
 * The fixed text of one block id, exactly BLOCK_CHARS characters of ASCII. It starts with the id
 * written in base 36, least significant digit first, so different ids always give different
 * text and usually differ at the very first character; words from a PRNG seeded by the id fill
 * the rest.
 * @param {number} id non-negative integer
 */
export function blockText(id) {
  if (!(Number.isInteger(id) && id >= 0)) throw new RangeError(`block id must be a non-negative integer, got ${id}`);
  const tag = id.toString(36).split('').reverse().join('');
  return seededText(Math.imul(id ^ 0x9e3779b9, 0x85ebca6b) ^ (id >>> 16), BLOCK_CHARS, `${tag}:`);
}

/**
 * The prompt of a trace request: its blocks' texts joined, cut to input_length tokens of
 * characters (the last block is usually partial).
 * @param {{ input_length: number, hash_ids: number[] }} request
 */
export function promptOfTraceRequest(request) {
  const chars = request.input_length * CHARS_PER_TOKEN;
  const parts = [];
  let length = 0;
  for (const id of request.hash_ids) {
    if (length >= chars) break;
    const text = blockText(id);
    parts.push(text);
    length += text.length;
  }
  // ids covering fewer tokens than input_length (never in the Mooncake file): pad
  let prompt = parts.join('');
  if (prompt.length < chars) prompt += ' '.repeat(chars - prompt.length);
  return prompt.slice(0, chars);
}
