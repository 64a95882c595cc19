// POST /generate of a simulated SGLang: its native generation route, one request or a batch,
// colocated or as the P and D legs of bootstrap rooms. Shapes, from the upstream sources:
// SGLang `/generate`: python/sglang/srt/entrypoints/http_server.py generate_request (stream:
// `data: <json>\n\n` per chunk, cumulative `text`, then `data: [DONE]\n\n`) and
// managers/io_struct.py GenerateReqInput (text | input_ids, sampling_params, stream, and for
// a batch lists of them; `meta_info` with id, finish_reason, prompt_tokens, completion_tokens,
// cached_tokens). The bootstrap fields are scalars for one request and arrays of the batch
// size for a batch, as sgl-project/sglang's router (pd_router.rs inject_bootstrap_into_value)
// sends them; P and D of a room meet through the cluster registry, as in the chat path.
import { randomUUID } from 'node:crypto';
import { publishRoom, waitRoom } from '../engine/registry.mjs';
import { noteViolation as violation } from '../engine/stats.mjs';
import { positiveInt, sameHost, sendError, sendJson, writeThenBreak } from '../wire.mjs';
import { prefill, promptShape, word } from './engine-model.mjs';
import { simTokenize } from './tokenizer.mjs';

/** @typedef {import('./engine-model.mjs').Call} Call */

/** @param {Call} call */
export async function generate({ res, body, hooks, ctx, entry }) {
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
  /** @type {import('../model/scheduler.mjs').Sequence[]} each prompt's request in the engine's step loop */
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
        computedTokens: p.tokens - p.cachedTokens,
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
      seqs.push(hooks.submit('remote', { hashes, tokens, maxTokens: maxNew, source: found.engineId, freshTokens: () => found.computedTokens }));
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
        await writeThenBreak(res, ctx, data);
        return;
      }
      res.write(data);
    }
  }
  res.end('data: [DONE]\n\n');
}
