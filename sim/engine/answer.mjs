// How the engine answers an OpenAI completion: the tokens of a sequence streamed (one SSE event a
// token) or as one JSON body, with the usage and TTFT / ITL / TPOT as the engines account them;
// a prefill leg's one-token answer; the error a refused or failed sequence gets.
import { chainedBlockHashes } from '../prefix-cache.mjs';
import { sendError, sendJson, sseHeaders, writeThenBreak } from '../wire.mjs';
import { FILLER, promptDigest } from './prompt.mjs';
import { sample } from './state.mjs';

/**
 * @typedef {import('node:http').ServerResponse} ServerResponse
 * @typedef {import('./state.mjs').EngineState} EngineState
 * @typedef {import('./types.mjs').Ctx} Ctx
 * @typedef {import('./stats.mjs').RequestStats} RequestStats
 * @typedef {import('../model/scheduler.mjs').Sequence} Sequence
 */

/**
 * The error a refused or failed sequence gets: JSON before any byte went out, else (a stream
 * whose headers are out) an error event, as vLLM and SGLang stream errors.
 * @param {EngineState} state
 * @param {ServerResponse} res @param {Sequence} seq
 */
export function refuse(state, res, seq) {
  if (seq.error === 'too_long') {
    // vLLM checks the prompt against max_model_len, which its KV cache can always hold
    const message = `This model's maximum context length is ${state.figures.numGpuBlocks * state.figures.blockSize} tokens. However, you requested ${seq.promptTokens} tokens.`;
    return sendError(res, 400, message, 'BadRequestError');
  }
  state.stats.errors++;
  const status = seq.errorStatus ?? 500;
  const message = seq.error ?? 'aborted';
  const type = /KVTransferError/.test(message) ? 'InternalServerError' : 'server_error';
  if (!res.headersSent) return sendError(res, status, message, type);
  if (res.destroyed) return;
  res.end(`data: ${JSON.stringify({ error: { message, type, param: null, code: status } })}\n\ndata: [DONE]\n\n`);
}

/**
 * Stream or answer the tokens of a sequence (one flushed SSE event per token, or one JSON body).
 * @param {EngineState} state
 * @param {ServerResponse} res
 * @param {Ctx} ctx
 * The first word of each choice is a digest of the prompt whose KV the answer was computed on
 * (`promptDigest`), so a test can tell an answer that belongs to another prompt.
 * @param {{ seq: Sequence, upstreamMs: number, source?: { upstreamMs: number, readyAt: number }, usage: object | (() => object), recordLatency: boolean, digests: string[], rec?: Partial<RequestStats> }} gen
 *   upstreamMs: simulated ms before this engine got the request that belong to its TTFT (its P's queue and prefill);
 *   source: a decode leg that waited here for its P: P's queue and prefill, and when P's KV was ready (this engine's clock)
 */
export async function generate(state, res, ctx, gen) {
  const { id, memory, blockTokens, charsPerToken } = state;
  const { chat, stream, model } = ctx;
  const { seq } = gen;
  const idStr = `${chat ? 'chatcmpl' : 'cmpl'}-${id}-${++state.completionCounter}`;
  const created = Math.floor(Date.now() / 1000);
  let chunksSent = 0;
  const outputTokens = seq.maxTokens;
  // a client that leaves aborts the sequence: its blocks are freed at once
  const previousClose = ctx.onClose;
  ctx.onClose = () => {
    previousClose?.();
    seq.abort();
  };
  if (ctx.closed) seq.abort();
  if (stream) sseHeaders(res);
  // n samples a prompt: choice i*n + j is prompt i's sample j (vllm serving_completion.py)
  const digests = gen.digests.flatMap((d) => Array.from({ length: ctx.samples ?? 1 }, () => d));
  const choicesN = digests.length;
  /** @type {string[][]} */
  const texts = digests.map(() => []);
  let previousAt = NaN;
  // vLLM `--stream-interval N` (and Dynamo's frontend, 20 by default): the first token goes out at
  // once, then one event every N tokens, and the last with whatever is left
  // (vllm/v1/engine/output_processor.py RequestState.make_request_output)
  const interval = Math.max(1, Math.floor(state.streamInterval ?? 1));
  /** words of each choice not yet sent */
  const unsent = digests.map(() => '');
  let sentTokens = 0;
  for (let i = 0; i < outputTokens; i++) {
    const token = await seq.next();
    if (!token) {
      if (seq.state === 'failed' && !ctx.closed) return refuse(state, res, seq);
      if (!res.destroyed && res.headersSent) res.destroy();
      return;
    }
    if (res.destroyed) return seq.abort();
    if (i > 0 && gen.recordLatency) sample(state, state.stats.itlMs, token.at - previousAt);
    previousAt = token.at;
    let data = '';
    const last = i === outputTokens - 1;
    const send = last || sentTokens === 0 || i + 1 - sentTokens >= interval;
    for (let c = 0; c < choicesN; c++) {
      const word = i === 0 ? digests[c] : ' ' + FILLER[(i + state.completionCounter) % FILLER.length];
      texts[c].push(word);
      state.stats.outputTokens++;
      if (!stream) continue;
      unsent[c] += word;
      if (!send) continue;
      const finish = last ? 'length' : null;
      const content = unsent[c];
      unsent[c] = '';
      const chunk = chat
        ? {
            id: idStr,
            object: 'chat.completion.chunk',
            created,
            model,
            choices: [{ index: c, delta: sentTokens === 0 ? { role: 'assistant', content } : { content }, logprobs: null, finish_reason: finish }],
          }
        : { id: idStr, object: 'text_completion', created, model, choices: [{ index: c, text: content, logprobs: null, finish_reason: finish }] };
      data += `data: ${JSON.stringify(chunk)}\n\n`;
    }
    if (stream && send) {
      sentTokens = i + 1;
      chunksSent++;
      if (ctx.stallAfterChunks !== undefined && chunksSent >= ctx.stallAfterChunks) {
        // silent from here on, connection open, until the client gives up
        res.write(data);
        return await untilClosed(ctx);
      }
      if (ctx.destroyAfterChunks !== undefined && chunksSent >= ctx.destroyAfterChunks) {
        // let the chunks reach the client first, so it sees a stream that breaks, not none
        seq.abort();
        await writeThenBreak(res, ctx, data);
        return;
      }
      res.write(data);
    }
  }
  // vLLM caches the full blocks of what it generated too (v1 KVCacheManager.cache_blocks over
  // every computed token): a chat's next turn repeats the answer after the prompt, so the node
  // that decoded it holds a longer prefix than the one that only prefilled it
  if (gen.recordLatency && chat && typeof ctx.promptText === 'string' && choicesN === 1) {
    memory.insertReady(chainedBlockHashes(`${ctx.promptText}\nassistant: ${texts[0].join('')}`, blockTokens * charsPerToken));
  }
  // TTFT as the engines account it: the P's queue and prefill, then this engine's wait, KV pull
  // and first step (the router's own time between the legs is not in it)
  const usage = typeof gen.usage === 'function' ? gen.usage() : gen.usage;
  // a leg that waited for its P: its own span, which covers P when both share a clock, and at
  // least P's queue and prefill plus what followed P here (engines on different clocks)
  const ttftMs = gen.source
    ? Math.max(seq.firstTokenAt - seq.arrival, gen.source.upstreamMs + (seq.firstTokenAt - gen.source.readyAt))
    : gen.upstreamMs + (seq.firstTokenAt - seq.arrival);
  const tpotMs = outputTokens > 1 ? (seq.finishedAt - seq.firstTokenAt) / (outputTokens - 1) : NaN;
  if (gen.recordLatency) {
    sample(state, state.stats.ttftMs, ttftMs);
    if (outputTokens > 1) sample(state, state.stats.tpotMs, tpotMs);
  }
  if (gen.rec) {
    Object.assign(gen.rec, {
      ttftMs,
      tpotMs,
      e2eMs: ttftMs + (seq.finishedAt - seq.firstTokenAt),
      kvWaitMs: seq.kvWaitMs,
      queueMs: seq.admittedAt - seq.arrival,
      // this engine's own part of the TTFT: its wait, the KV pull, its first step
      decodeFirstTokenMs: seq.firstTokenAt - (gen.source ? Math.max(seq.arrival, gen.source.readyAt) : seq.arrival),
      outputTokens,
      preemptions: seq.preemptions,
    });
  }
  if (stream) {
    if (ctx.includeUsage) {
      const usageChunk = { id: idStr, object: chat ? 'chat.completion.chunk' : 'text_completion', created, model, choices: [], usage };
      res.write(`data: ${JSON.stringify(usageChunk)}\n\n`);
    }
    res.end('data: [DONE]\n\n');
    return;
  }
  const body = chat
    ? {
        id: idStr,
        object: 'chat.completion',
        created,
        model,
        choices: texts.map((t, c) => ({ index: c, message: { role: 'assistant', content: t.join('') }, logprobs: null, finish_reason: 'length' })),
        usage,
      }
    : {
        id: idStr,
        object: 'text_completion',
        created,
        model,
        choices: texts.map((t, c) => ({ index: c, text: t.join(''), logprobs: null, finish_reason: 'length' })),
        usage,
      };
  const json = JSON.stringify(body);
  if (ctx.stallAfterChunks !== undefined) {
    // stall on a non-stream answer: half a body, then silence with the connection open
    res.writeHead(200, { 'content-type': 'application/json' });
    res.write(json.slice(0, Math.floor(json.length / 2)));
    return await untilClosed(ctx);
  }
  if (ctx.destroyAfterChunks !== undefined) {
    // midstream on a non-stream answer: half a body, then the connection dies
    res.writeHead(200, { 'content-type': 'application/json' });
    await writeThenBreak(res, ctx, json.slice(0, Math.floor(json.length / 2)));
    return;
  }
  sendJson(res, 200, body);
}

/**
 * @param {EngineState} state
 * @param {string | number[]} q
 */
export function tokensOf(state, q) {
  const { charsPerToken } = state;
  return typeof q === 'string' ? Math.ceil(q.length / charsPerToken) : q.length;
}

/**
 * A prefill leg's JSON answer: one token a prompt (each the prompt's digest), plus the handle.
 * @param {EngineState} state
 * @param {Ctx} ctx @param {(string | number[])[]} prompts @param {object} usage @param {Record<string, unknown> | null | undefined} params
 */
export function prefillAnswer(state, ctx, prompts, usage, params) {
  const { id } = state;
  const idStr = `${ctx.chat ? 'chatcmpl' : 'cmpl'}-${id}-${++state.completionCounter}`;
  return {
    id: idStr,
    object: ctx.chat ? 'chat.completion' : 'text_completion',
    created: Math.floor(Date.now() / 1000),
    model: ctx.model,
    choices: prompts.map((q, index) => {
      const word = promptDigest(q);
      return ctx.chat
        ? { index, message: { role: 'assistant', content: word }, logprobs: null, finish_reason: 'length' }
        : { index, text: word, logprobs: null, finish_reason: 'length' };
    }),
    usage,
    kv_transfer_params: params,
  };
}

/**
 * @param {EngineState} state
 * @param {number} promptTokens @param {number} completionTokens @param {number} cachedTokens
 */
export function usageOf(state, promptTokens, completionTokens, cachedTokens) {
  // vllm serving_completion.py / serving_chat.py: `if self.enable_prompt_tokens_details and
  // final_res.num_cached_tokens:` — the field is left out when the count is 0 (or the flag is off).
  /** @type {Record<string, unknown>} */
  const usage = { prompt_tokens: promptTokens, completion_tokens: completionTokens, total_tokens: promptTokens + completionTokens };
  if (state.promptTokensDetails && cachedTokens > 0) usage.prompt_tokens_details = { cached_tokens: cachedTokens };
  return usage;
}

/** Resolves when the router closes this request's connection. @param {{ closed: boolean, onClose?: () => void }} ctx */
function untilClosed(ctx) {
  return new Promise((resolve) => {
    if (ctx.closed) return resolve(undefined);
    const before = ctx.onClose;
    ctx.onClose = () => {
      before?.();
      resolve(undefined);
    };
  });
}
