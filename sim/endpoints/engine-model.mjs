// How the routes of sim/endpoints.mjs use the engine model: a prompt's tokens and prefix units
// with the engine's geometry, a prefill through its step loop, the words an answer is made of.
import { chainedBlockHashes } from '../prefix-cache.mjs';
import { FILLER } from '../engine/prompt.mjs';

/**
 * What sim/engine.mjs lends sim/endpoints.mjs for one request: its engine, options, shared registry
 * and accessors for the state it owns (its closures reassign them on reset).
 * @typedef {object} EndpointHooks
 * @property {import('../engine/types.mjs').Engine} engine
 * @property {import('../engine/types.mjs').EngineOptions} options
 * @property {import('../engine/types.mjs').Registry} registry
 * @property {() => any} stats the engine's live stats object
 * @property {() => Required<import('../engine/types.mjs').Fault>} fault the engine's current fault
 * @property {(delta: number) => void} inflight
 * @property {(entry: import('../engine/types.mjs').RequestLogEntry & { bootstrapRooms?: string[] }) => void} record
 * @property {(kind: 'local' | 'prefill' | 'remote', o: { hashes: string[], tokens: number, maxTokens: number, source?: string }) => import('../model/scheduler.mjs').Sequence} submit
 *   a request into the engine's step loop (sim/model/scheduler.mjs), its figures counted on admission
 */

/**
 * One request of sim/endpoints.mjs as its route family sees it.
 * @typedef {{ req: import('node:http').IncomingMessage, res: import('node:http').ServerResponse, body: any, model: string, hooks: EndpointHooks, ctx: { closed: boolean, destroyedByUs: boolean, destroyAfterChunks?: number }, entry: import('../engine/types.mjs').RequestLogEntry & { bootstrapRooms?: string[] } }} Call
 */

/** tokenizer and prefix-cache geometry, with sim/engine.mjs's defaults */
export function timing(options) {
  return {
    charsPerToken: options.charsPerToken ?? 4,
    blockTokens: options.blockTokens ?? 512,
  };
}

/** A prompt's tokens and prefix-cache units. */
export function promptShape(hooks, text) {
  const t = timing(hooks.options);
  return { tokens: Math.max(1, Math.ceil(text.length / t.charsPerToken)), hashes: chainedBlockHashes(text, t.blockTokens * t.charsPerToken) };
}

/** Prefill on this engine through its step loop (its prefix cache tells what was held already). */
export async function prefill(hooks, text) {
  const { tokens, hashes } = promptShape(hooks, text);
  const seq = hooks.submit('prefill', { hashes, tokens, maxTokens: 1 });
  await seq.finished;
  return { tokens, cachedTokens: seq.cachedTokens, hashes, seq };
}

export function word(i, seed) {
  return (i === 0 ? '' : ' ') + FILLER[(i + seed) % FILLER.length];
}
