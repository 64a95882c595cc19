// The tokenizer routes of a simulated vLLM: POST /v1/embeddings, /tokenize and /detokenize, over
// a tokenizer of its own that /detokenize inverts exactly. Shapes, from the upstream sources:
// vLLM `/v1/embeddings` (EmbeddingResponse), `/tokenize` ({count, max_model_len, tokens,
// token_strs}) and `/detokenize` ({prompt}): vllm/entrypoints/openai/protocol.py and
// vllm/entrypoints/serve/tokenize.
import { randomUUID } from 'node:crypto';
import { promptOf } from '../engine/prompt.mjs';
import { positiveInt, sendError, sendJson } from '../wire.mjs';

/** @typedef {import('./engine-model.mjs').Call} Call */

/** what the simulated model reports as its context length (vLLM's max_model_len) */
const MAX_MODEL_LEN = 131072;
const EMBEDDING_DIMENSIONS = 16;

/**
 * The simulator's tokenizer: UTF-8 bytes three at a time, one token id each (id = length << 24 |
 * bytes), so /detokenize inverts /tokenize exactly and every id fits in 27 bits.
 * @param {string} text @returns {number[]}
 */
export function simTokenize(text) {
  const bytes = Buffer.from(text, 'utf8');
  const ids = [];
  for (let i = 0; i < bytes.length; i += 3) {
    const chunk = bytes.subarray(i, i + 3);
    let id = chunk.length << 24;
    chunk.forEach((b, k) => (id |= b << (8 * (2 - k))));
    ids.push(id);
  }
  return ids;
}

/** @param {number[]} ids @returns {string | undefined} undefined when an id is not one of ours */
export function simDetokenize(ids) {
  const bytes = [];
  for (const id of ids) {
    const n = id >>> 24;
    if (!Number.isInteger(id) || id < 0 || n < 1 || n > 3) return undefined;
    for (let k = 0; k < n; k++) bytes.push((id >>> (8 * (2 - k))) & 0xff);
  }
  return Buffer.from(bytes).toString('utf8');
}

/** A deterministic unit vector for a text (same text, same vector). */
function embed(text, dimensions) {
  const out = [];
  let h = 2166136261;
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 16777619);
  for (let i = 0; i < dimensions; i++) {
    h = Math.imul(h ^ (h >>> 15), 2246822507) ^ i;
    out.push(((h >>> 0) / 4294967295) * 2 - 1);
  }
  const norm = Math.hypot(...out) || 1;
  return out.map((x) => x / norm);
}

/** @param {Call} call */
export function embeddings({ res, body, model }) {
  const input = body.input;
  /** @type {string[]} */
  let texts;
  if (typeof input === 'string') texts = [input];
  else if (Array.isArray(input) && input.length > 0 && input.every((x) => typeof x === 'string')) texts = input;
  else if (Array.isArray(input) && input.length > 0 && input.every((x) => typeof x === 'number')) texts = [simDetokenize(input) ?? input.join(' ')];
  else if (Array.isArray(input) && input.length > 0 && input.every((x) => Array.isArray(x))) texts = input.map((ids) => simDetokenize(ids) ?? ids.join(' '));
  else return sendError(res, 400, 'input must be a string, a list of strings or token ids', 'invalid_request_error', null, 'input');
  const dimensions = positiveInt(body.dimensions) ?? EMBEDDING_DIMENSIONS;
  const base64 = body.encoding_format === 'base64';
  let promptTokens = 0;
  const data = texts.map((text, index) => {
    promptTokens += simTokenize(text).length;
    const vector = embed(text, dimensions);
    const embedding = base64 ? Buffer.from(new Float32Array(vector).buffer).toString('base64') : vector;
    return { index, object: 'embedding', embedding };
  });
  sendJson(res, 200, {
    id: `embd-${randomUUID().replace(/-/g, '')}`,
    object: 'list',
    created: Math.floor(Date.now() / 1000),
    model,
    data,
    usage: { prompt_tokens: promptTokens, total_tokens: promptTokens, completion_tokens: 0, prompt_tokens_details: null },
  });
}

/** @param {Call} call */
export function tokenize({ res, body }) {
  const text = typeof body.prompt === 'string' ? body.prompt : Array.isArray(body.messages) ? promptOf(body, true) : undefined;
  if (typeof text !== 'string') return sendError(res, 400, 'prompt or messages is required', 'invalid_request_error', null, 'prompt');
  const tokens = simTokenize(text);
  sendJson(res, 200, {
    count: tokens.length,
    max_model_len: MAX_MODEL_LEN,
    tokens,
    token_strs: body.return_token_strs === true ? tokens.map((id) => simDetokenize([id]) ?? '') : null,
  });
}

/** @param {Call} call */
export function detokenize({ res, body }) {
  if (!Array.isArray(body.tokens) || !body.tokens.every((x) => typeof x === 'number')) {
    return sendError(res, 400, 'tokens must be a list of token ids', 'invalid_request_error', null, 'tokens');
  }
  const prompt = simDetokenize(body.tokens);
  if (prompt === undefined) return sendError(res, 400, 'token id out of vocabulary', 'invalid_request_error', null, 'tokens');
  sendJson(res, 200, { prompt });
}
