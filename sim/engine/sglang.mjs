// SGLang's P/D flow on the completion routes: a prefill leg and a decode leg meet in a bootstrap
// room (the router sends both at once, naming P's bootstrap host and port and a room number); a
// decode-mode node asked without one fails its handshake.
import { randomUUID } from 'node:crypto';
import { sameHost, sendError, sseHeaders } from '../wire.mjs';
import { generate, refuse, usageOf } from './answer.mjs';
import { promptDigest } from './prompt.mjs';
import { publishRoom, remember, waitRoom } from './registry.mjs';
import { submit } from './requests.mjs';
import { violation } from './state.mjs';

/**
 * @typedef {import('./state.mjs').EngineState} EngineState
 * @typedef {import('./types.mjs').Call} Call
 * @typedef {{ room: string, bHost: string, bPort: number, namesMe: boolean }} Bootstrap
 */

/**
 * A completion request that carries a bootstrap room: its prefill leg or its decode leg.
 * @param {EngineState} state @param {Call} call
 */
export async function sglangRoom(state, call) {
  const { id, role, host, registry, engine } = state;
  const { body, entry } = call;
  const room = entry.bootstrapRoom ?? '';
  const bHost = String(body.bootstrap_host ?? '');
  const bPort = Number(body.bootstrap_port);
  // a `both` engine takes the prefill leg of a room that names it, the first time it sees it
  const namesMe = sameHost(bHost, host) && bPort === engine.bootstrapPort;
  const isPrefillLeg = role === 'prefill' || (role === 'both' && namesMe && !registry.claimedRooms.has(`${id}/${room}`));
  if (isPrefillLeg) return await sglangPrefill(state, call, { room, bHost, bPort, namesMe });
  return await sglangDecode(state, call, { room, bHost, bPort, namesMe });
}

/**
 * The prefill leg of a room: prefill, publish the room for its decode leg, answer one token.
 * @param {EngineState} state @param {Call} call @param {Bootstrap} bootstrap
 */
async function sglangPrefill(state, call, { room, bHost, bPort, namesMe }) {
  const { id, role, host, registry, engine } = state;
  const { res, ctx, prompts, digest, hashes, tokens, rec } = call;
  if (role === 'both') remember(registry.claimedRooms, `${id}/${room}`, true);
  state.stats.requests.sglangPrefill++;
  if (!namesMe) {
    violation(state, `sglang prefill leg names bootstrap ${bHost}:${bPort}, this node is ${host}:${engine.bootstrapPort}`);
  }
  rec.leg = 'sglangPrefill';
  // SGLang answers stream:true with a StreamingResponse at once (sglang
  // entrypoints/openai/serving_chat.py / serving_completions.py), so headers go out before
  // the prefill; the body follows when the first token exists.
  if (ctx.stream) sseHeaders(res);
  // A client that leaves makes SGLang abort the request (stream: Starlette sees the
  // disconnect, StreamingResponse background = tokenizer_manager.create_abort_task; non-stream:
  // TokenizerManager._wait_one_response checks request.is_disconnected() every 4 s) ->
  // AbortReq; the prefill's sender fails the room and D reports
  // "KVTransferError(bootstrap_room=...): Aborted by AbortReq" (sglang srt/disaggregation/prefill.py, decode.py).
  let done = false;
  let aborted = false;
  /** @type {NodeJS.Timeout | undefined} */
  let abortTimer;
  const seq = submit(state, 'prefill', { hashes, tokens, maxTokens: 1, rec });
  ctx.onClose = () => {
    if (done) return;
    abortTimer = setTimeout(
      () => {
        if (done) return;
        aborted = true;
        state.stats.sglangAborts++;
        seq.abort();
        publishRoom(registry, room, { engineId: id, host, bootstrapPort: engine.bootstrapPort, port: engine.port, hashes: [], queueMs: 0, prefillMs: 0, aborted: true });
      },
      ctx.stream ? state.sglangStreamAbortGraceMs : state.sglangAbortGraceMs,
    );
    abortTimer.unref?.();
  };
  await seq.finished;
  done = true;
  clearTimeout(abortTimer);
  if (aborted) return;
  if (seq.state !== 'finished') {
    publishRoom(registry, room, { engineId: id, host, bootstrapPort: engine.bootstrapPort, port: engine.port, hashes: [], queueMs: 0, prefillMs: 0, aborted: true });
    return refuse(state, res, seq);
  }
  const queueMs = seq.admittedAt - seq.arrival;
  const prefillMs = seq.firstTokenAt - seq.admittedAt;
  Object.assign(rec, { queueMs, prefillMs, kvWaitMs: seq.kvWaitMs });
  publishRoom(registry, room, {
    engineId: id,
    host,
    bootstrapPort: engine.bootstrapPort,
    port: engine.port,
    hashes,
    queueMs,
    prefillMs,
    digest,
    computedTokens: tokens - seq.cachedTokens,
  });
  return await generate(state, res, ctx, {
    seq,
    upstreamMs: 0,
    usage: usageOf(state, tokens, 1, seq.cachedTokens),
    recordLatency: false,
    digests: prompts.map(promptDigest),
  });
}

/**
 * The decode leg of a room: blocks taken at once, then the KV pulled once the room's prefill is published.
 * @param {EngineState} state @param {Call} call @param {Bootstrap} bootstrap
 */
async function sglangDecode(state, call, { room, bHost, bPort }) {
  const { bootstrapTimeoutMs, registry } = state;
  const { res, ctx, prompts, digest, hashes, tokens, maxTokens, rec } = call;
  state.stats.requests.sglangDecode++;
  rec.leg = 'sglangDecode';
  // SGLang's decode node takes a request into its PreallocQueue at once: it reserves the KV
  // blocks, then the prefill's sender fills them (srt/disaggregation/decode.py)
  const digests = prompts.map(promptDigest);
  /** @type {{ upstreamMs: number, readyAt: number, computedTokens?: number }} */
  const source = { upstreamMs: 0, readyAt: 0 };
  const seq = submit(state, 'remote', {
    hashes,
    tokens,
    maxTokens,
    rec,
    freshTokens: () => source.computedTokens,
    awaitSource: async () => {
      const found = await waitRoom(registry, room, bootstrapTimeoutMs, ctx);
      if (!found) throw Object.assign(new Error(`bootstrap room ${room}: no prefill arrived within ${bootstrapTimeoutMs} ms`), { status: 504 });
      if (found.aborted) throw Object.assign(new Error(`KVTransferError(bootstrap_room=${room}): Aborted by AbortReq`), { status: 500 });
      if (!sameHost(bHost, found.host) || bPort !== found.bootstrapPort) {
        violation(state, `sglang decode leg names bootstrap ${bHost}:${bPort} but room ${room} was prefilled on ${found.host}:${found.bootstrapPort}`);
        throw Object.assign(new Error(`bootstrap room ${room} was not prefilled on ${bHost}:${bPort}`), { status: 502 });
      }
      digests[0] = found.digest ?? digest;
      if (digests[0] !== digest) state.stats.foreignHandleReads++;
      Object.assign(source, { upstreamMs: found.queueMs + found.prefillMs, readyAt: state.time.clock.now(), computedTokens: found.computedTokens });
      return found.engineId;
    },
  });
  return await generate(state, res, ctx, {
    seq,
    upstreamMs: 0,
    source,
    usage: usageOf(state, tokens, maxTokens, tokens),
    recordLatency: true,
    digests,
    rec,
  });
}

/**
 * An SGLang decode node asked without bootstrap fields: it cannot prefill by itself.
 * @param {EngineState} state @param {Call} call
 */
export async function sglangDecodeWithoutBootstrap(state, call) {
  const { res, ctx, requestId, rec } = call;
  // An SGLang decode-mode server has no local prefill: every request goes through its
  // PreallocQueue with a KV receiver for the request's bootstrap address. Without bootstrap
  // fields that address is "None:None"; _ensure_prefill_info retries it 15 times a second
  // apart, then aborts the receiver and the request fails with 500 "Decode handshake failed"
  // (sgl-project/sglang python/sglang/srt/disaggregation/decode.py DecodePreallocQueue).
  state.stats.requests.sglangDecode++;
  rec.leg = 'sglangDecode';
  if (ctx.stream) sseHeaders(res);
  await state.time.clock.sleep(state.sglangHandshakeTimeoutMs);
  if (ctx.closed) return;
  state.stats.errors++;
  const message = `Decode handshake failed for request rank=0 decode_req.req.rid='${requestId ?? randomUUID().replace(/-/g, '')}' decode_req.req.bootstrap_room=None with exception Could not fetch prefill parallel info from None:None after 15 attempts`;
  if (!ctx.stream) return sendError(res, 500, message, 'InternalServerError');
  res.end(`data: ${JSON.stringify({ error: { message, type: 'InternalServerError', param: null, code: 500 } })}\n\ndata: [DONE]\n\n`);
  return;
}
