// vLLM's NIXL P/D flow on the completion routes (vllm distributed/kv_transfer/kv_connector/v1/
// nixl_connector.py): the P leg answers a single-use handle in kv_transfer_params, the D leg
// pulls the KV the handle names.
import { randomUUID } from 'node:crypto';
import { positiveInt, sendJson } from '../wire.mjs';
import { generate, prefillAnswer, refuse, tokensOf, usageOf } from './answer.mjs';
import { promptDigest } from './prompt.mjs';
import { remember } from './registry.mjs';
import { holdKv, prefillOnly, submit } from './requests.mjs';
import { violation } from './state.mjs';

/**
 * @typedef {import('./state.mjs').EngineState} EngineState
 * @typedef {import('./types.mjs').Call} Call
 */

/**
 * The prefill leg (kv_transfer_params.do_remote_decode): prefill, one token, and a single-use
 * handle naming this engine; P holds the blocks until a decode node reads it.
 * @param {EngineState} state @param {Call} call
 */
export async function vllmPrefill(state, call) {
  const { id, host, blockTokens, registry, core, engine } = state;
  const { res, ctx, body, prompts, hashes, tokens, requestId, rec } = call;
  state.stats.requests.vllmPrefill++;
  if (body.stream === true) violation(state, 'vllm prefill leg has stream:true');
  if (body.max_tokens !== undefined && body.max_tokens !== 1) violation(state, `vllm prefill leg has max_tokens:${JSON.stringify(body.max_tokens)}`);
  if (body.max_tokens === undefined && body.max_completion_tokens === undefined) violation(state, 'vllm prefill leg has no max_tokens:1');
  if (body.max_completion_tokens !== undefined && body.max_completion_tokens !== 1)
    violation(state, `vllm prefill leg has max_completion_tokens:${JSON.stringify(body.max_completion_tokens)}`);
  for (const field of ['stream_options', 'min_tokens', 'min_completion_tokens']) {
    if (body[field] !== undefined) violation(state, `vllm prefill leg has ${field}`);
  }
  rec.leg = 'vllmPrefill';
  // P keeps the blocks of a handle until a decode node read them (nixl delay_free_blocks)
  const p = await prefillOnly(state, hashes, tokens, rec, !ctx.omitKvTransferParams, ctx);
  // A client gone before the answer cancels the handler (vllm entrypoints/utils.py
  // with_cancellation) and aborts the request: its blocks are freed at once, no handle.
  if (ctx.closed) {
    core.releaseHeld(p.seq);
    return;
  }
  if (p.seq.state !== 'finished') return refuse(state, res, p.seq);
  if (requestId) remember(registry.prefills, requestId, { queueMs: p.queueMs, prefillMs: p.prefillMs, computedTokens: tokens - p.cachedTokens });
  const totalBlocks = Math.ceil(tokens / blockTokens);
  state.stats.outputTokens += prompts.length;
  /** @type {Record<string, unknown> | undefined} */
  let params;
  if (!ctx.omitKvTransferParams) {
    // Every sub-request (one per prompt, and per sample when n > 1: vllm v1/engine/parallel_sampling.py
    // fans n out into child requests) ends length-capped and holds its blocks; the response
    // carries one kv_transfer_params only — serving_completion.py takes
    // final_res_batch[0].kv_transfer_params — so the others stay held until the timeout.
    const samples = positiveInt(body.n) ?? 1;
    const base = `cmpl-${requestId ?? randomUUID()}-${++state.internalCounter}`;
    /** @type {string[]} */
    const ids = [];
    prompts.forEach((q, i) => {
      for (let s = 0; s < samples; s++) {
        const remoteRequestId = `${base}-${i}${samples > 1 ? `-${s}` : ''}`;
        ids.push(remoteRequestId);
        // the first handle holds the prefill's blocks in KV memory (the others: the simulator prefills prompt 1 only)
        holdKv(state, `${id}/${remoteRequestId}`, promptDigest(q), i === 0 ? totalBlocks : Math.ceil(tokensOf(state, q) / blockTokens), i === 0 && s === 0 ? p.seq : undefined);
      }
    });
    // nixl/scheduler.py request_finished: the handle's field set
    params = {
      do_remote_prefill: true,
      do_remote_decode: false,
      remote_block_ids: Array.from({ length: totalBlocks }, (_, i) => i),
      remote_engine_id: id,
      remote_request_id: ids[0],
      remote_host: host,
      remote_port: engine.port,
      tp_size: 1,
      remote_num_tokens: tokens,
    };
  }
  if (params && ctx.bigKvInt) {
    // an exact integer beyond 2^53, as JSON text (JSON.stringify cannot write one)
    const text = JSON.stringify(prefillAnswer(state, ctx, prompts, usageOf(state, tokens, 1, p.cachedTokens), params)).replace(
      '"remote_engine_id":',
      '"remote_big_id":12345678901234567890,"remote_engine_id":',
    );
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
    return res.end(text);
  }
  return sendJson(res, 200, prefillAnswer(state, ctx, prompts, usageOf(state, tokens, 1, p.cachedTokens), params));
}

/**
 * The decode leg (kv_transfer_params.do_remote_prefill): read the handle, pull what this node
 * lacks from the P it names, decode.
 * @param {EngineState} state @param {Call} call
 */
export async function vllmDecode(state, call) {
  const { registry } = state;
  const { res, ctx, prompts, hashes, tokens, maxTokens, kv, requestId, rec } = call;
  state.stats.requests.vllmDecode++;
  if (typeof kv.remote_engine_id !== 'string') violation(state, 'vllm decode leg without remote_engine_id');
  for (const field of ['remote_block_ids', 'remote_host', 'remote_port', 'remote_request_id']) {
    if (kv[field] === undefined || kv[field] === null) violation(state, `vllm decode leg without kv_transfer_params.${field}`);
  }
  const source = typeof kv.remote_engine_id === 'string' ? kv.remote_engine_id : undefined;
  const remote = source === undefined ? undefined : registry.engines.get(source);
  if (source !== undefined && registry.engines.size > 1 && !remote) violation(state, `vllm decode leg names unknown remote_engine_id ${source}`);
  if (remote && kv.remote_port !== undefined && kv.remote_port !== null && kv.remote_port !== remote.port) {
    violation(state, `vllm decode leg names remote_port ${kv.remote_port}, engine ${source} listens on ${remote.port}`);
  }
  // A handle is single-use: P frees its blocks on the first read's notification
  // (nixl worker.py _get_new_notifs -> finished_sending), or at the timeout/lease end, and
  // later reads are only logged ("Potentially invalid KV blocks for unrecognized request ...
  // were retrieved by a decode worker"): D answers 200 from blocks that now hold something else.
  const h = registry.handles.get(`${source}/${kv.remote_request_id}`);
  /** @type {string[]} */
  const digests = [];
  if (h?.state !== 'held') {
    state.stats.staleHandleReads += prompts.length;
    for (let i = 0; i < prompts.length; i++) digests.push(promptDigest(`stale:${source}/${kv.remote_request_id}/${i}`));
  } else {
    h.free('read');
    // every prompt of a batch reads the same handle: prompts 2..N decode on prompt 1's KV
    prompts.forEach((q) => {
      if (promptDigest(q) !== h.digest) state.stats.foreignHandleReads++;
      digests.push(h.digest);
    });
  }
  const upstream = requestId ? registry.prefills.get(requestId) : undefined;
  rec.leg = 'vllmDecode';
  // D counts the KV it pulled as cached (num_cached_tokens includes external tokens)
  return await generate(state, res, ctx, {
    seq: submit(state, 'remote', { hashes, tokens, maxTokens, rec, source, freshTokens: () => upstream?.computedTokens }),
    upstreamMs: upstream ? upstream.queueMs + upstream.prefillMs : 0,
    usage: usageOf(state, tokens, maxTokens, tokens),
    recordLatency: true,
    digests,
    rec,
  });
}
