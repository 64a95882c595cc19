// POST /v1/responses of a simulated vLLM: Responses API answers, streamed or whole, and the
// P/D legs of a Responses request. Shapes, from the upstream sources:
// vLLM `/v1/responses`: vllm/entrypoints/openai/responses/protocol.py (ResponsesRequest,
// ResponsesResponse, ResponseUsage) and responses/serving.py (responses_full_generator,
// responses_stream_generator: `response.created`, `response.in_progress`, the item events of
// responses/simple_streaming_events.py, then `response.completed` carrying the final response
// with `usage`; sequence_number counts every event from 0). SSE framing from
// responses/api_router.py `_convert_stream_to_sse_events`: `event: <type>\ndata: <json>\n\n`,
// and no `data: [DONE]`. `kv_transfer_params` on the request and the response: vLLM PR #37424
// ("[Responses API] Add kv_transfer_params for PD disaggregation"), same handles as chat.
// A response that stopped on max_output_tokens has status "incomplete" with
// incomplete_details {reason: "max_output_tokens"} (ResponsesResponse.from_request).
import { randomUUID } from 'node:crypto';
import { MAX_REMEMBERED } from '../engine/registry.mjs';
import { noteViolation as violation } from '../engine/stats.mjs';
import { positiveInt, sendError, sendJson, writeThenBreak } from '../wire.mjs';
import { prefill, promptShape, timing, word } from './engine-model.mjs';

/** @typedef {import('./engine-model.mjs').Call} Call */

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
export async function responses({ res, body, model, hooks, ctx }) {
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
  /** @type {import('../model/scheduler.mjs').Sequence} */
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
      await writeThenBreak(res, ctx, data);
      return false;
    }
    res.write(data);
    return true;
  };
  // created and in_progress as soon as the request is in, before any output; the item events with
  // the first output (responses/serving.py responses_stream_generator, simple_streaming_events.py
  // `first_delta_sent`)
  const inProgress = base('in_progress', [], null);
  if (!(await send('response.created', { response: inProgress }))) return;
  if (!(await send('response.in_progress', { response: inProgress }))) return;
  let textOut = '';
  for (let i = 0; i < outputTokens; i++) {
    if (!(await seq.next())) return failed();
    if (ctx.closed || res.destroyed) return;
    if (i === 0) {
      if (!(await send('response.output_item.added', { item: message('', 'in_progress'), output_index: 0 }))) return;
      const part = { annotations: [], text: '', type: 'output_text', logprobs: [] };
      if (!(await send('response.content_part.added', { content_index: 0, item_id: itemId, output_index: 0, part }))) return;
    }
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
