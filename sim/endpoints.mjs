// The simulated engine's other routes: vLLM's Responses API (`POST /v1/responses`), embeddings and
// tokenizer routes, and SGLang's native `POST /generate`. sim/engine.mjs hands these paths here
// (one hook in its request dispatch); the chat/completions routes stay with the engine
// (sim/engine/completions.mjs). Each request is recorded in the engine's request log like a
// completion request.
//
// One module a route family: sim/endpoints/responses.mjs, tokenizer.mjs (embeddings, tokenize,
// detokenize) and generate.mjs, each citing the upstream sources of its shapes.
import { setTimeout as sleepReal } from 'node:timers/promises';
import { lowerHeaders, readBody, sendError } from './wire.mjs';
import { sendStatusFault } from './engine/faults.mjs';
import { generate } from './endpoints/generate.mjs';
import { responses } from './endpoints/responses.mjs';
import { detokenize, embeddings, tokenize } from './endpoints/tokenizer.mjs';

export { responsesPromptText } from './endpoints/responses.mjs';
export { simDetokenize, simTokenize } from './endpoints/tokenizer.mjs';

export const ENDPOINT_PATHS = ['/v1/responses', '/v1/embeddings', '/tokenize', '/detokenize', '/generate'];

/**
 * @typedef {import('./endpoints/engine-model.mjs').EndpointHooks} EndpointHooks
 * @typedef {import('./endpoints/engine-model.mjs').Call} Call
 */

/**
 * @param {import('node:http').IncomingMessage} req @param {import('node:http').ServerResponse} res
 * @param {string} path one of ENDPOINT_PATHS @param {EndpointHooks} hooks
 */
export async function handleEndpoint(req, res, path, hooks) {
  const stats = hooks.stats();
  hooks.inflight(1);
  stats.requests.total++;
  (stats.endpoints ??= {})[path] = (stats.endpoints[path] ?? 0) + 1;
  const ctx = { closed: false, destroyedByUs: false };
  res.on('close', () => {
    hooks.inflight(-1);
    ctx.closed = true;
    if (!res.writableFinished && !ctx.destroyedByUs) hooks.stats().clientAborts++;
  });
  const raw = await readBody(req);
  /** @type {import('./engine/types.mjs').RequestLogEntry & { bootstrapRooms?: string[] }} */
  const entry = { path, headers: lowerHeaders(req.headers), body: raw, receivedAt: Date.now() };
  // rooms are cut from the raw text, so a 63-bit integer stays exact (a JS number would round it)
  const room = /"bootstrap_room"\s*:\s*(-?\d+|"[^"]*"|\[[^\]]*\])/.exec(raw);
  if (room) {
    if (room[1].startsWith('['))
      entry.bootstrapRooms = room[1]
        .slice(1, -1)
        .split(',')
        .map((s) => s.trim().replace(/"/g, ''))
        .filter(Boolean);
    else {
      entry.bootstrapRoom = room[1].replace(/"/g, '');
      entry.bootstrapRoomBareInteger = !room[1].startsWith('"');
    }
  }
  hooks.record(entry);

  const faulted = await applyFault(req, res, hooks, ctx);
  if (faulted === 'answered') return;

  /** @type {any} */
  let body;
  try {
    body = JSON.parse(raw);
  } catch {
    return sendError(res, 400, 'request body is not valid JSON', 'invalid_request_error');
  }
  if (!body || typeof body !== 'object' || Array.isArray(body)) return sendError(res, 400, 'request body must be a JSON object', 'invalid_request_error');
  const models = hooks.options.models ?? ['sim-model'];
  if (typeof body.model === 'string' && !models.includes(body.model)) {
    return sendError(res, 404, `The model \`${body.model}\` does not exist.`, 'invalid_request_error', 'model_not_found');
  }
  const model = typeof body.model === 'string' ? body.model : models[0];
  const call = { req, res, body, model, hooks, ctx, entry };
  try {
    switch (path) {
      case '/v1/responses':
        return await responses(call);
      case '/v1/embeddings':
        return embeddings(call);
      case '/tokenize':
        return tokenize(call);
      case '/detokenize':
        return detokenize(call);
      case '/generate':
        return await generate(call);
    }
  } catch (error) {
    stats.errors++;
    if (!res.headersSent) sendError(res, 500, `simulated engine failed: ${error instanceof Error ? error.message : String(error)}`, 'server_error');
    else res.destroy();
  }
}

/**
 * The engine's injected fault, consumed like the chat path does (sim/engine/faults.mjs).
 * @returns {Promise<'answered' | 'continue'>}
 */
async function applyFault(req, res, hooks, ctx) {
  const fault = hooks.fault();
  if (fault.mode === 'none' || !(fault.count > 0)) return 'continue';
  const left = fault.count - 1;
  hooks.engine.setFault(left <= 0 ? { ...fault, mode: 'none', count: Infinity } : { ...fault, count: left });
  hooks.stats().faultsInjected++;
  switch (fault.mode) {
    case 'status500':
    case 'status400':
      sendStatusFault(res, fault.mode);
      return 'answered';
    case 'hang':
      return 'answered'; // never answers; the close listener counts the client giving up
    case 'reset':
      ctx.destroyedByUs = true;
      req.socket.destroy();
      return 'answered';
    case 'slow':
      await sleepReal(fault.delayMs);
      return ctx.closed ? 'answered' : 'continue';
    case 'midstream':
      ctx.destroyAfterChunks = fault.afterChunks;
      return 'continue';
    default:
      return 'continue';
  }
}
