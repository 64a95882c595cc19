// The simulated engine's other routes: vLLM's Responses API (`POST /v1/responses`), embeddings and
// tokenizer routes, and SGLang's native `POST /generate`. sim/engine.mjs hands these paths here
// (one hook in its request dispatch); the chat/completions model (prefill queue, KV pulls) stays
// there. Each request is recorded in the engine's request log like a completion request.
//
// Shapes, from the upstream sources:
// - vLLM `/v1/responses`: vllm/entrypoints/openai/responses/protocol.py (ResponsesRequest,
//   ResponsesResponse, ResponseUsage) and responses/serving.py (responses_full_generator,
//   responses_stream_generator: `response.created`, `response.in_progress`, the item events of
//   responses/simple_streaming_events.py, then `response.completed` carrying the final response
//   with `usage`; sequence_number counts every event from 0). SSE framing from
//   responses/api_router.py `_convert_stream_to_sse_events`: `event: <type>\ndata: <json>\n\n`,
//   and no `data: [DONE]`. `kv_transfer_params` on the request and the response: vLLM PR #37424
//   ("[Responses API] Add kv_transfer_params for PD disaggregation"), same handles as chat.
//   A response that stopped on max_output_tokens has status "incomplete" with
//   incomplete_details {reason: "max_output_tokens"} (ResponsesResponse.from_request).
// - vLLM `/v1/embeddings` (EmbeddingResponse), `/tokenize` ({count, max_model_len, tokens,
//   token_strs}) and `/detokenize` ({prompt}): vllm/entrypoints/openai/protocol.py and
//   vllm/entrypoints/serve/tokenize.
// - SGLang `/generate`: python/sglang/srt/entrypoints/http_server.py generate_request (stream:
//   `data: <json>\n\n` per chunk, cumulative `text`, then `data: [DONE]\n\n`) and
//   managers/io_struct.py GenerateReqInput (text | input_ids, sampling_params, stream, and for
//   a batch lists of them; `meta_info` with id, finish_reason, prompt_tokens, completion_tokens,
//   cached_tokens). The bootstrap fields are scalars for one request and arrays of the batch
//   size for a batch, as sgl-project/sglang's router (pd_router.rs inject_bootstrap_into_value)
//   sends them; P and D of a room meet through the cluster registry, as in the chat path.
import { randomUUID } from 'node:crypto';
import { setTimeout as sleepReal } from 'node:timers/promises';
import { promptOf } from './engine.mjs';
import { lowerHeaders, positiveInt, publish, readBody, sameHost, sendError, sendJson, waitFor } from './wire.mjs';
import { chainedBlockHashes } from './prefix-cache.mjs';

export const ENDPOINT_PATHS = ['/v1/responses', '/v1/embeddings', '/tokenize', '/detokenize', '/generate'];

const FILLER = 'the quick brown fox jumps over a lazy dog while seven bright stars drift across calm northern water'.split(' ');
const MAX_REMEMBERED = 10000;
/** what the simulated model reports as its context length (vLLM's max_model_len) */
const MAX_MODEL_LEN = 131072;
const EMBEDDING_DIMENSIONS = 16;

/**
 * What sim/engine.mjs lends this module for one request: its engine, options, shared registry
 * and accessors for the state it owns (its closures reassign them on reset).
 * @typedef {object} EndpointHooks
 * @property {import('./engine.mjs').Engine} engine
 * @property {import('./engine.mjs').EngineOptions} options
 * @property {import('./engine.mjs').Registry} registry
 * @property {() => any} stats the engine's live stats object
 * @property {() => Required<import('./engine.mjs').Fault>} fault the engine's current fault
 * @property {(delta: number) => void} inflight
 * @property {(entry: import('./engine.mjs').RequestLogEntry & { bootstrapRooms?: string[] }) => void} record
 * @property {(kind: 'local' | 'prefill' | 'remote', o: { hashes: string[], tokens: number, maxTokens: number, source?: string }) => import('./model/scheduler.mjs').Sequence} submit
 *   a request into the engine's step loop (sim/model/scheduler.mjs), its figures counted on admission
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
  /** @type {import('./engine.mjs').RequestLogEntry & { bootstrapRooms?: string[] }} */
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
 * @typedef {{ req: import('node:http').IncomingMessage, res: import('node:http').ServerResponse, body: any, model: string, hooks: EndpointHooks, ctx: { closed: boolean, destroyedByUs: boolean, destroyAfterChunks?: number }, entry: import('./engine.mjs').RequestLogEntry & { bootstrapRooms?: string[] } }} Call
 */

/**
 * The engine's injected fault, consumed like the chat path does (sim/engine.mjs handleCompletion).
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
      sendError(res, 500, 'simulated internal error', 'server_error');
      return 'answered';
    case 'status400':
      sendError(res, 400, 'simulated bad request', 'invalid_request_error');
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

// ---- the engine model ----------------------------------------------------------------------

/** tokenizer and prefix-cache geometry, with sim/engine.mjs's defaults */
function timing(options) {
  return {
    charsPerToken: options.charsPerToken ?? 4,
    blockTokens: options.blockTokens ?? 512,
  };
}

/** A prompt's tokens and prefix-cache units. */
function promptShape(hooks, text) {
  const t = timing(hooks.options);
  return { tokens: Math.max(1, Math.ceil(text.length / t.charsPerToken)), hashes: chainedBlockHashes(text, t.blockTokens * t.charsPerToken) };
}

/** Prefill on this engine through its step loop (its prefix cache tells what was held already). */
async function prefill(hooks, text) {
  const { tokens, hashes } = promptShape(hooks, text);
  const seq = hooks.submit('prefill', { hashes, tokens, maxTokens: 1 });
  await seq.finished;
  return { tokens, cachedTokens: seq.cachedTokens, hashes, seq };
}

function word(i, seed) {
  return (i === 0 ? '' : ' ') + FILLER[(i + seed) % FILLER.length];
}

/** @param {unknown} v */

// ---- POST /v1/responses (vLLM) -----------------------------------------------------------

/** The prompt text of a Responses request: instructions, then each input message as `role: text`. */
export function responsesPromptText(body) {
  const parts = [];
  if (typeof body.instructions === 'string') parts.push(`system: ${body.instructions}`);
  if (typeof body.input === 'string') parts.push(`user: ${body.input}`);
  else if (Array.isArray(body.input)) {
    for (const item of body.input) {
      if (!item || typeof item !== 'object') continue;
      const content =
        typeof item.content === 'string'
          ? item.content
          : Array.isArray(item.content)
            ? item.content.map((/** @type {any} */ p) => (p && typeof p.text === 'string' ? p.text : '')).join('')
            : typeof item.output === 'string'
              ? item.output
              : '';
      parts.push(`${item.role ?? item.type ?? 'user'}: ${content}`);
    }
  }
  return parts.join('\n');
}

/** @type {WeakMap<object, Map<string, true>>} response ids this engine stored (per registry) */
const storedResponses = new WeakMap();

/** @param {Call} call */
async function responses({ res, body, model, hooks, ctx }) {
  const { engine, options, registry } = hooks;
  const stats = hooks.stats();
  if (!(typeof body.input === 'string' || Array.isArray(body.input))) return sendError(res, 400, 'input is required', 'invalid_request_error', null, 'input');
  if (body.max_output_tokens !== undefined && body.max_output_tokens !== null && !positiveInt(body.max_output_tokens)) {
    return sendError(res, 400, 'max_output_tokens must be a positive integer', 'invalid_request_error', null, 'max_output_tokens');
  }
  const stored = storedResponses.get(registry) ?? new Map();
  storedResponses.set(registry, stored);
  // vLLM answers 404 for a previous_response_id it never stored (serving.py _make_not_found_error).
  // Off by default: which engine stored a response is the router's concern (issue 13 item 1).
  if (options.responsesStore === true && typeof body.previous_response_id === 'string' && !stored.has(`${engine.id}/${body.previous_response_id}`)) {
    return sendError(res, 404, `Response with id '${body.previous_response_id}' not found.`, 'invalid_request_error', null, 'response_id');
  }
  const text = responsesPromptText(body);
  const maxTokens = positiveInt(body.max_output_tokens) ?? 16;
  const kv = body.kv_transfer_params;
  const t = timing(options);

  /** @type {{ tokens: number, cachedTokens: number }} */
  let prompt;
  /** @type {import('./model/scheduler.mjs').Sequence} */
  let seq;
  /** @type {object | undefined} */
  let kvOut;
  let outputTokens = maxTokens;
  if (kv && typeof kv === 'object' && kv.do_remote_decode === true) {
    // P leg: prefill, one output token, a handle D pulls the KV with
    stats.requests.vllmPrefill++;
    if (body.stream === true) violation(stats, 'vllm responses prefill leg has stream:true');
    if (body.max_output_tokens !== 1) violation(stats, `vllm responses prefill leg has max_output_tokens:${JSON.stringify(body.max_output_tokens)}`);
    const p = await prefill(hooks, text);
    ({ seq } = p);
    prompt = p;
    if (seq.state !== 'finished') return sendError(res, 500, `simulated engine failed: ${seq.error ?? 'aborted'}`, 'server_error');
    const totalBlocks = Math.ceil(prompt.tokens / t.blockTokens);
    outputTokens = 1;
    kvOut = {
      do_remote_prefill: true,
      do_remote_decode: false,
      remote_engine_id: engine.id,
      remote_block_ids: Array.from({ length: totalBlocks }, (_, i) => i),
      remote_host: engine.host,
      remote_port: engine.port,
      tp_size: 1,
    };
  } else if (kv && typeof kv === 'object' && kv.do_remote_prefill === true) {
    // D leg: pull P's KV, then decode; D counts the KV it pulled as cached
    stats.requests.vllmDecode++;
    if (typeof kv.remote_engine_id !== 'string') violation(stats, 'vllm responses decode leg without remote_engine_id');
    else if (registry.engines.size > 1 && !registry.engines.has(kv.remote_engine_id))
      violation(stats, `vllm responses decode leg names unknown remote_engine_id ${kv.remote_engine_id}`);
    const { tokens, hashes } = promptShape(hooks, text);
    seq = hooks.submit('remote', { hashes, tokens, maxTokens, source: typeof kv.remote_engine_id === 'string' ? kv.remote_engine_id : undefined });
    prompt = { tokens, cachedTokens: tokens };
  } else {
    // colocated, or a D whose P handed over nothing (kv_transfer_params null): prefill here
    if (kv === undefined) stats.requests.colocated++;
    else stats.requests.vllmDecode++;
    const { tokens, hashes } = promptShape(hooks, text);
    seq = hooks.submit('local', { hashes, tokens, maxTokens });
    prompt = {
      tokens,
      get cachedTokens() {
        return seq.cachedTokens;
      },
    };
  }
  res.on('close', () => seq.abort());
  if (ctx.closed) return seq.abort();

  const wordSeed = stats.outputTokens;
  // the sequence ended early (the client left, or the engine refused it)
  const failed = () => {
    if (ctx.closed || res.destroyed) return;
    if (!res.headersSent) return sendError(res, 500, `simulated engine failed: ${seq.error ?? 'aborted'}`, 'server_error');
    res.destroy();
  };
  const responseId = `resp_${randomUUID().replace(/-/g, '')}`;
  const itemId = `msg_${randomUUID().replace(/-/g, '')}`;
  const createdAt = Math.floor(Date.now() / 1000);
  // every generation here stops on its token budget: vLLM reports that as "incomplete"
  const base = (/** @type {string} */ status, /** @type {object[]} */ output, /** @type {object | null} */ usage) => ({
    id: responseId,
    created_at: createdAt,
    incomplete_details: status === 'incomplete' ? { reason: 'max_output_tokens' } : null,
    instructions: typeof body.instructions === 'string' ? body.instructions : null,
    metadata: body.metadata ?? null,
    model,
    object: 'response',
    output,
    parallel_tool_calls: body.parallel_tool_calls ?? true,
    temperature: body.temperature ?? 1.0,
    tool_choice: body.tool_choice ?? 'auto',
    tools: body.tools ?? [],
    top_p: body.top_p ?? 1.0,
    background: body.background ?? false,
    max_output_tokens: outputTokens,
    max_tool_calls: body.max_tool_calls ?? null,
    previous_response_id: body.previous_response_id ?? null,
    prompt: null,
    reasoning: body.reasoning ?? null,
    service_tier: body.service_tier ?? 'auto',
    status,
    text: body.text ?? null,
    top_logprobs: null,
    truncation: body.truncation ?? 'disabled',
    usage,
    user: body.user ?? null,
    input_messages: null,
    output_messages: null,
    kv_transfer_params: kvOut ?? null,
  });
  const usageOf = (/** @type {number} */ n) => ({
    input_tokens: prompt.tokens,
    input_tokens_details: { cached_tokens: prompt.cachedTokens, input_tokens_per_turn: [], cached_tokens_per_turn: [] },
    output_tokens: n,
    output_tokens_details: { reasoning_tokens: 0, tool_output_tokens: 0, output_tokens_per_turn: [], tool_output_tokens_per_turn: [] },
    total_tokens: prompt.tokens + n,
  });
  const message = (/** @type {string} */ textOut, /** @type {string} */ status) => ({
    id: itemId,
    content: status === 'in_progress' ? [] : [{ annotations: [], text: textOut, type: 'output_text', logprobs: null }],
    role: 'assistant',
    status,
    type: 'message',
  });
  const remember = () => {
    if (body.store !== false) {
      stored.set(`${engine.id}/${responseId}`, true);
      if (stored.size > MAX_REMEMBERED) stored.delete(/** @type {string} */ (stored.keys().next().value));
    }
  };

  if (body.stream !== true) {
    const words = [];
    for (let i = 0; i < outputTokens; i++) {
      if (!(await seq.next()) || ctx.closed) return failed();
      words.push(word(i, wordSeed));
    }
    stats.outputTokens += outputTokens;
    remember();
    return sendJson(res, 200, base('incomplete', [message(words.join(''), 'completed')], usageOf(outputTokens)));
  }

  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', connection: 'keep-alive' });
  res.flushHeaders();
  let sequence = 0;
  let chunks = 0;
  /** @returns {Promise<boolean>} false once the stream is gone */
  const send = async (/** @type {string} */ type, /** @type {object} */ fields) => {
    if (res.destroyed) return false;
    const data = `event: ${type}\ndata: ${JSON.stringify({ ...fields, sequence_number: sequence++, type })}\n\n`;
    chunks++;
    if (ctx.destroyAfterChunks !== undefined && chunks >= ctx.destroyAfterChunks) {
      // the events reach the client first, so it sees a stream that breaks, not none
      await new Promise((resolve) => res.write(data, () => resolve(undefined)));
      await sleepReal(10);
      ctx.destroyedByUs = true;
      res.socket?.destroy();
      return false;
    }
    res.write(data);
    return true;
  };
  const inProgress = base('in_progress', [], null);
  if (!(await send('response.created', { response: inProgress }))) return;
  if (!(await send('response.in_progress', { response: inProgress }))) return;
  if (!(await send('response.output_item.added', { item: message('', 'in_progress'), output_index: 0 }))) return;
  if (!(await send('response.content_part.added', { content_index: 0, item_id: itemId, output_index: 0, part: { annotations: [], text: '', type: 'output_text', logprobs: [] } })))
    return;
  let textOut = '';
  for (let i = 0; i < outputTokens; i++) {
    if (!(await seq.next())) return failed();
    if (ctx.closed || res.destroyed) return;
    const delta = word(i, wordSeed);
    textOut += delta;
    stats.outputTokens++;
    if (!(await send('response.output_text.delta', { content_index: 0, delta, item_id: itemId, output_index: 0, logprobs: [] }))) return;
  }
  if (!(await send('response.output_text.done', { content_index: 0, item_id: itemId, output_index: 0, text: textOut, logprobs: [] }))) return;
  if (
    !(await send('response.content_part.done', {
      content_index: 0,
      item_id: itemId,
      output_index: 0,
      part: { annotations: [], text: textOut, type: 'output_text', logprobs: null },
    }))
  )
    return;
  if (!(await send('response.output_item.done', { item: message(textOut, 'completed'), output_index: 0 }))) return;
  remember();
  if (!(await send('response.completed', { response: base('incomplete', [message(textOut, 'completed')], usageOf(outputTokens)) }))) return;
  res.end();
}

// ---- POST /v1/embeddings, /tokenize, /detokenize (vLLM) ----------------------------------

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
function embeddings({ res, body, model }) {
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
function tokenize({ res, body }) {
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
function detokenize({ res, body }) {
  if (!Array.isArray(body.tokens) || !body.tokens.every((x) => typeof x === 'number')) {
    return sendError(res, 400, 'tokens must be a list of token ids', 'invalid_request_error', null, 'tokens');
  }
  const prompt = simDetokenize(body.tokens);
  if (prompt === undefined) return sendError(res, 400, 'token id out of vocabulary', 'invalid_request_error', null, 'tokens');
  sendJson(res, 200, { prompt });
}

// ---- POST /generate (SGLang) -------------------------------------------------------------

/** @param {Call} call */
async function generate({ res, body, hooks, ctx, entry }) {
  const { engine, options, registry } = hooks;
  const stats = hooks.stats();
  // one request or a batch: text (string | string[]) or input_ids (number[] | number[][])
  /** @type {string[]} */
  let prompts;
  let batch = false;
  if (typeof body.text === 'string') prompts = [body.text];
  else if (Array.isArray(body.text) && body.text.length > 0 && body.text.every((x) => typeof x === 'string')) [prompts, batch] = [body.text, true];
  else if (Array.isArray(body.input_ids) && body.input_ids.length > 0 && body.input_ids.every((x) => typeof x === 'number')) prompts = [body.input_ids.join(' ')];
  else if (Array.isArray(body.input_ids) && body.input_ids.length > 0 && body.input_ids.every((x) => Array.isArray(x)))
    [prompts, batch] = [body.input_ids.map((ids) => ids.join(' ')), true];
  else return sendError(res, 400, 'Either text or input_ids should be provided.', 'invalid_request_error');
  const n = prompts.length;
  const sp = body.sampling_params && typeof body.sampling_params === 'object' ? body.sampling_params : {};
  const maxNew = positiveInt(sp.max_new_tokens) ?? 128;

  // bootstrap fields: all absent (colocated), scalars for one request, arrays of n for a batch
  const room = body.bootstrap_room;
  const disaggregated = room !== undefined && room !== null;
  /** @type {Array<{ host: string, port: number, room: string }>} */
  const legs = [];
  if (disaggregated) {
    const fields = ['bootstrap_host', 'bootstrap_port', 'bootstrap_room'];
    for (const f of fields) {
      const v = body[f];
      if (batch && !(Array.isArray(v) && v.length === n)) {
        violation(stats, `sglang /generate batch of ${n} has ${f} ${Array.isArray(v) ? `of length ${v.length}` : 'as a scalar'}`);
        return sendError(res, 400, `${f} must be a list of ${n} for a batch of ${n}`, 'invalid_request_error', null, f);
      }
      if (!batch && Array.isArray(v)) {
        violation(stats, `sglang /generate single request has ${f} as a list`);
        return sendError(res, 400, `${f} must be a scalar for a single request`, 'invalid_request_error', null, f);
      }
    }
    // the exact room integers, cut from the raw text into the log entry
    const rooms = batch ? (entry.bootstrapRooms ?? body.bootstrap_room.map(String)) : [entry.bootstrapRoom ?? String(room)];
    for (let i = 0; i < n; i++) {
      legs.push({ host: String(batch ? body.bootstrap_host[i] : body.bootstrap_host), port: Number(batch ? body.bootstrap_port[i] : body.bootstrap_port), room: rooms[i] ?? '' });
    }
  }
  const isPrefill = disaggregated && engine.role !== 'decode';
  if (!disaggregated) stats.requests.colocated++;
  else if (isPrefill) stats.requests.sglangPrefill++;
  else stats.requests.sglangDecode++;

  const rid = typeof body.rid === 'string' ? body.rid : randomUUID().replace(/-/g, '');
  /** @type {Array<{ tokens: number, cached: number }>} */
  const prompt = [];
  /** @type {import('./model/scheduler.mjs').Sequence[]} each prompt's request in the engine's step loop */
  const seqs = [];
  res.on('close', () => {
    for (const q of seqs) q.abort();
  });
  for (let i = 0; i < n; i++) {
    if (!disaggregated) {
      const { tokens, hashes } = promptShape(hooks, prompts[i]);
      const q = hooks.submit('local', { hashes, tokens, maxTokens: maxNew });
      seqs.push(q);
      prompt.push({
        tokens,
        get cached() {
          return q.cachedTokens;
        },
      });
    } else if (isPrefill) {
      const leg = legs[i];
      if (!sameHost(leg.host, engine.host) || leg.port !== engine.bootstrapPort) {
        violation(stats, `sglang /generate prefill leg names bootstrap ${leg.host}:${leg.port}, this node is ${engine.host}:${engine.bootstrapPort}`);
      }
      const p = await prefill(hooks, prompts[i]);
      seqs.push(p.seq);
      if (p.seq.state !== 'finished') {
        if (ctx.closed) return;
        stats.errors++;
        return sendError(res, 500, `simulated engine failed: ${p.seq.error ?? 'aborted'}`, 'server_error');
      }
      publishRoom(registry, leg.room, {
        engineId: engine.id,
        host: engine.host,
        bootstrapPort: engine.bootstrapPort,
        port: engine.port,
        hashes: p.hashes,
        queueMs: p.seq.admittedAt - p.seq.arrival,
        prefillMs: p.seq.firstTokenAt - p.seq.admittedAt,
      });
      prompt.push({ tokens: p.tokens, cached: p.cachedTokens });
    } else {
      const leg = legs[i];
      const found = await waitRoom(registry, leg.room, options.bootstrapTimeoutMs ?? 30000, ctx);
      if (ctx.closed) return;
      if (!found) {
        stats.errors++;
        return sendError(res, 504, `bootstrap room ${leg.room}: no prefill arrived`, 'server_error');
      }
      if (!sameHost(found.host, leg.host) || found.bootstrapPort !== leg.port) {
        violation(stats, `sglang /generate decode leg names bootstrap ${leg.host}:${leg.port} but room ${leg.room} was prefilled on ${found.host}:${found.bootstrapPort}`);
      }
      const { tokens, hashes } = promptShape(hooks, prompts[i]);
      seqs.push(hooks.submit('remote', { hashes, tokens, maxTokens: maxNew, source: found.engineId }));
      prompt.push({ tokens, cached: tokens });
    }
  }
  if (ctx.closed) return;
  // a P leg generates one token (SGLang's prefill server); D and colocated the whole budget
  const outTokens = isPrefill ? 1 : maxNew;
  const seed = stats.outputTokens;
  const metaInfo = (/** @type {number} */ i, /** @type {number} */ done, /** @type {boolean} */ finished) => ({
    id: batch ? `${rid}_${i}` : rid,
    finish_reason: finished ? { type: 'length', length: done } : null,
    prompt_tokens: prompt[i].tokens,
    completion_tokens: done,
    cached_tokens: prompt[i].cached,
    e2e_latency: 0,
  });

  /** The k-th token of every prompt; false once one of them ended early. @param {number} k */
  const step = async (k) => {
    for (const q of seqs) {
      // a P leg's sequence produced its one token already (buffered)
      if (k >= q.maxTokens) continue;
      if (!(await q.next())) return false;
    }
    return true;
  };
  const failed = () => {
    if (ctx.closed || res.destroyed) return;
    if (!res.headersSent) return sendError(res, 500, 'simulated engine failed: aborted', 'server_error');
    res.destroy();
  };
  if (body.stream !== true) {
    const text = [];
    for (let k = 0; k < outTokens; k++) if (!(await step(k))) return failed();
    if (ctx.closed) return;
    stats.outputTokens += n * outTokens;
    const outs = prompts.map((_, i) => {
      let s = '';
      for (let k = 0; k < outTokens; k++) s += word(k, seed + i);
      text.push(s);
      return { text: s, output_ids: simTokenize(s), meta_info: metaInfo(i, outTokens, true) };
    });
    return sendJson(res, 200, batch ? outs : outs[0]);
  }

  // SGLang sends headers at once and then one event per step; `text` is cumulative
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', connection: 'keep-alive' });
  res.flushHeaders();
  const texts = prompts.map(() => '');
  let chunks = 0;
  for (let k = 0; k < outTokens; k++) {
    if (!(await step(k))) return failed();
    if (ctx.closed || res.destroyed) return;
    for (let i = 0; i < n; i++) {
      texts[i] += word(k, seed + i);
      stats.outputTokens++;
      const out = { text: texts[i], output_ids: simTokenize(texts[i]), meta_info: metaInfo(i, k + 1, k === outTokens - 1), ...(batch ? { index: i } : {}) };
      const data = `data: ${JSON.stringify(out)}\n\n`;
      if (ctx.destroyAfterChunks !== undefined && ++chunks >= ctx.destroyAfterChunks) {
        await new Promise((resolve) => res.write(data, () => resolve(undefined)));
        await sleepReal(10);
        ctx.destroyedByUs = true;
        res.socket?.destroy();
        return;
      }
      res.write(data);
    }
  }
  res.end('data: [DONE]\n\n');
}

// ---- shared with sim/engine.mjs's model --------------------------------------------------

function violation(stats, why) {
  stats.protocolViolations++;
  stats.violations.push(why);
  if (stats.violations.length > 50) stats.violations.shift();
}

function publishRoom(registry, room, entry) {
  publish(registry.rooms, registry.roomWaiters, room, entry, MAX_REMEMBERED);
}

function waitRoom(registry, room, timeoutMs, ctx) {
  return waitFor(registry.rooms, registry.roomWaiters, room, timeoutMs, ctx);
}
