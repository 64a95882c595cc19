// The OpenAI completion routes of a simulated engine (POST /v1/chat/completions and
// /v1/completions): a request is logged, meets the injected fault, is validated as vLLM validates
// it, then goes to its leg by what it carries: an SGLang bootstrap room (sim/engine/sglang.mjs), a
// Mooncake transfer_id (mooncake.mjs), a vLLM handle (vllm.mjs), or nothing (colocated, or a
// decode node that prefills by itself).
import { chainedBlockHashes } from '../prefix-cache.mjs';
import { lowerHeaders, positiveInt, readBody, sendError } from '../wire.mjs';
import { generate, usageOf } from './answer.mjs';
import { applyFault } from './faults.mjs';
import { mooncakeDecode, mooncakeMissing, mooncakePrefill } from './mooncake.mjs';
import { promptDigest, promptOf, promptsOf } from './prompt.mjs';
import { submit } from './requests.mjs';
import { sglangDecodeWithoutBootstrap, sglangRoom } from './sglang.mjs';
import { violation } from './state.mjs';
import { vllmDecode, vllmPrefill } from './vllm.mjs';

/**
 * @typedef {import('./state.mjs').EngineState} EngineState
 * @typedef {import('./types.mjs').Ctx} Ctx
 * @typedef {import('./types.mjs').Call} Call
 * @typedef {import('./types.mjs').RequestLogEntry} RequestLogEntry
 * @typedef {import('./stats.mjs').RequestStats} RequestStats
 */

/** requests kept in the request log, oldest dropped first */
export const MAX_LOG = 500;
/** per-request figures kept per engine (keyed by x-request-id), oldest dropped first */
const MAX_REQUEST_STATS = 50000;

/**
 * @param {EngineState} state @param {import('node:http').IncomingMessage} req
 * @param {import('node:http').ServerResponse} res @param {string} path
 */
export async function handleCompletion(state, req, res, path) {
  const { blockTokens, charsPerToken, inflightIds, models, registry, role } = state;
  state.inflight++;
  state.stats.requests.total++;
  /** @type {Ctx} */
  const ctx = { chat: path === '/v1/chat/completions', stream: false, model: models[0], includeUsage: false, destroyedByUs: false, closed: false };
  res.on('close', () => {
    state.inflight--;
    ctx.closed = true;
    ctx.onClose?.();
    if (!res.writableFinished && !ctx.destroyedByUs) state.stats.clientAborts++;
    state.time.holds.legEnded(legId);
  });
  // the router has handed a leg of this request to an engine: its own time for it stops here
  // (sim/model/router-holds.mjs; a no-op unless a benchmark client said it sent the request)
  const legId = /** @type {string | undefined} */ (req.headers['x-request-id']);
  state.time.holds.legStarted(legId);
  const raw = await readBody(req);
  const roomMatch = /"bootstrap_room"\s*:\s*(-?\d+|"[^"]*")/.exec(raw);
  /** @type {RequestLogEntry} */
  const entry = { path, headers: lowerHeaders(req.headers), body: raw, receivedAt: Date.now() };
  if (roomMatch) {
    entry.bootstrapRoom = roomMatch[1].replace(/"/g, '');
    entry.bootstrapRoomBareInteger = !roomMatch[1].startsWith('"');
  }
  state.log.push(entry);
  if (state.log.length > MAX_LOG) state.log.shift();

  if ((await applyFault(state, req, res, raw, ctx)) === 'answered') return;

  /** @type {any} */
  let body;
  try {
    body = JSON.parse(raw);
  } catch {
    return sendError(res, 400, 'request body is not valid JSON', 'invalid_request_error');
  }
  if (!body || typeof body !== 'object' || Array.isArray(body)) {
    return sendError(res, 400, 'request body must be a JSON object', 'invalid_request_error');
  }
  // A request carrying a handle that D rejects before admission makes D notify P, which frees
  // the blocks at once: vllm entrypoints/openai/engine/serving.py
  // _with_kv_transfer_rejection_cleanup -> AsyncLLM.notify_kv_transfer_request_rejected ->
  // nixl/scheduler.py request_finished (do_remote_prefill still set: _reqs_need_recv[req] = [])
  // -> worker _read_blocks with no local blocks -> send_notif. Framework-level rejections (bad
  // JSON) happen before that wrapper and notify nobody.
  const rejectBeforeAdmission = (/** @type {number} */ status, /** @type {string} */ message, /** @type {string | null} */ code = null) => {
    const kvr = body.kv_transfer_params;
    if (kvr && typeof kvr === 'object' && kvr.do_remote_prefill === true) {
      state.stats.rejectedHandleRequests++;
      const key = kvr.transfer_id !== undefined ? undefined : `${kvr.remote_engine_id}/${kvr.remote_request_id}`;
      const h = key === undefined ? undefined : registry.handles.get(key);
      if (h && state.rejectionReleasesHandle) h.free('released');
    }
    return sendError(res, status, message, 'invalid_request_error', code);
  };
  if (typeof body.model === 'string' && !models.includes(body.model)) {
    return rejectBeforeAdmission(404, `The model \`${body.model}\` does not exist.`, 'model_not_found');
  }
  const prompt = promptOf(body, ctx.chat);
  if (!prompt) return rejectBeforeAdmission(400, ctx.chat ? 'messages is required' : 'prompt is required');
  const prompts = promptsOf(body, ctx.chat);
  const digest = promptDigest(prompt);
  ctx.promptText = typeof prompt === 'string' ? prompt : undefined;
  ctx.model = typeof body.model === 'string' ? body.model : models[0];
  ctx.stream = body.stream === true;
  // vLLM and SGLang `--enable-force-include-usage`: a usage frame whatever the client asked
  // (vLLM serving_chat.py / serving_completion.py should_include_usage)
  ctx.includeUsage = ctx.stream && (body.stream_options?.include_usage === true || state.forceIncludeUsage === true);
  ctx.samples = positiveInt(body.n) ?? 1;
  const maxTokens = positiveInt(body.max_completion_tokens) ?? positiveInt(body.max_tokens) ?? 16;
  const { units, unitsPerBlock, tokens } =
    typeof prompt === 'string'
      ? { units: prompt, unitsPerBlock: blockTokens * charsPerToken, tokens: Math.ceil(prompt.length / charsPerToken) }
      : { units: prompt, unitsPerBlock: blockTokens, tokens: prompt.length };
  const hashes = chainedBlockHashes(units, unitsPerBlock);
  const kv = body.kv_transfer_params;
  const requestId = entry.headers['x-request-id'];
  const isRoom = Boolean(roomMatch && body.bootstrap_room !== undefined && body.bootstrap_room !== null);
  // vLLM keys its request state by the X-Request-Id it is given (serving_completion.py
  // _base_request_id); a second one in flight is refused: vllm v1/engine/output_processor.py
  // OutputProcessor.add_request "Request id ... already running." (SGLang legs are keyed by room.)
  if (requestId && !isRoom && state.rejectDuplicateRequestIds) {
    if (inflightIds.has(requestId)) {
      state.stats.duplicateRequestIds++;
      return sendError(res, 400, `Request id ${requestId} already running.`, 'invalid_request_error');
    }
    inflightIds.add(requestId);
    res.on('close', () => inflightIds.delete(requestId));
  }
  /** @type {Partial<RequestStats>} */
  const rec = {};
  if (requestId) {
    state.requestStats.delete(requestId);
    state.requestStats.set(requestId, rec);
    if (state.requestStats.size > MAX_REQUEST_STATS) state.requestStats.delete(/** @type {string} */ (state.requestStats.keys().next().value));
  }
  /** @type {Call} */
  const call = { res, ctx, body, entry, prompts, digest, hashes, tokens, maxTokens, kv, requestId, rec };

  try {
    if (isRoom) return await sglangRoom(state, call);
    // vLLM MooncakeConnector flow (vllm examples/disaggregated/mooncake_connector/mooncake_connector_proxy.py,
    // kv_connector/v1/mooncake/mooncake_connector.py): a router-made transfer_id on both legs.
    if (kv && typeof kv === 'object' && kv.transfer_id !== undefined && kv.do_remote_decode === true) {
      return await mooncakePrefill(state, call);
    }
    if (kv && typeof kv === 'object' && kv.transfer_id !== undefined && kv.do_remote_prefill === true) {
      state.stats.requests.mooncakeDecode++;
      rec.leg = 'mooncakeDecode';
      const missing = mooncakeMissing(kv);
      if (missing.length === 0) return await mooncakeDecode(state, call);
      // "Got invalid KVTransferParams ... will not utilize KVTransfer": D prefills by itself
      violation(state, `mooncake decode leg without ${missing.join(', ')}`);
    }

    if (kv && typeof kv === 'object' && kv.do_remote_decode === true && kv.transfer_id === undefined) {
      return await vllmPrefill(state, call);
    }

    if (kv && typeof kv === 'object' && kv.do_remote_prefill === true) {
      return await vllmDecode(state, call);
    }

    if (state.kind === 'sglang' && role === 'decode') return await sglangDecodeWithoutBootstrap(state, call);
    // Plain OpenAI (colocated), or a vLLM decode node given no kv_transfer_params (or null: P
    // stopped on EOS), which prefills by itself through its own step loop: its prefill chunks
    // share steps with its decodes.
    if (kv === undefined) state.stats.requests.colocated++;
    else state.stats.requests.vllmDecode++;
    if (role === 'decode') state.stats.selfPrefills++;
    rec.leg = kv === undefined ? 'colocated' : 'vllmDecode';
    const seq = submit(state, 'local', { hashes, tokens, maxTokens, rec });
    return await generate(state, res, ctx, {
      seq,
      upstreamMs: 0,
      usage: () => usageOf(state, tokens, maxTokens, seq.cachedTokens),
      recordLatency: true,
      digests: prompts.map(promptDigest),
      rec,
    });
  } catch (error) {
    state.stats.errors++;
    if (!res.headersSent) sendError(res, 500, `simulated engine failed: ${error instanceof Error ? error.message : String(error)}`, 'server_error');
    else res.destroy();
  }
}
