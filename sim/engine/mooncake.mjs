// vLLM's MooncakeConnector flow on the completion routes (vllm
// examples/disaggregated/mooncake_connector/mooncake_connector_proxy.py,
// kv_connector/v1/mooncake/mooncake_connector.py): a router-made transfer_id on both legs; D finds
// P through P's bootstrap server and pulls the blocks once P has them.
import { sameHost, sendError, sendJson } from '../wire.mjs';
import { generate, prefillAnswer, refuse, usageOf } from './answer.mjs';
import { promptDigest } from './prompt.mjs';
import { publishTransfer, remember, waitTransfer } from './registry.mjs';
import { holdKv, prefillOnly, submit } from './requests.mjs';
import { violation } from './state.mjs';

/**
 * @typedef {import('./state.mjs').EngineState} EngineState
 * @typedef {import('./types.mjs').Call} Call
 */

/** The fields a decode leg's kv_transfer_params lacks (then D prefills by itself). @param {any} kv */
export const mooncakeMissing = (kv) => ['remote_engine_id', 'remote_bootstrap_addr', 'transfer_id'].filter((f) => kv[f] === undefined || kv[f] === null || kv[f] === '');

/**
 * The prefill leg: prefill, hold the blocks for the transfer_id and publish it for D; the answer
 * carries no kv_transfer_params (request_finished returns (delay_free, None)).
 * @param {EngineState} state @param {Call} call
 */
export async function mooncakePrefill(state, call) {
  const { id, blockTokens, registry } = state;
  const { res, ctx, prompts, digest, hashes, tokens, kv, requestId, rec } = call;
  state.stats.requests.mooncakePrefill++;
  rec.leg = 'mooncakePrefill';
  const p = await prefillOnly(state, hashes, tokens, rec, Boolean(kv.transfer_id), ctx);
  if (ctx.closed) return;
  if (p.seq.state !== 'finished') return refuse(state, res, p.seq);
  if (requestId) remember(registry.prefills, requestId, { queueMs: p.queueMs, prefillMs: p.prefillMs, computedTokens: tokens - p.cachedTokens });
  const transferId = String(kv.transfer_id);
  if (!kv.transfer_id) {
    // update_state_after_alloc: "Missing transfer_id in kv_transfer_params from router!" — never sent
    violation(state, 'mooncake prefill leg without transfer_id');
  } else {
    // request_finished: delay_free_blocks until D pulls (the worker frees on the send's end)
    holdKv(state, `mc/${id}/${transferId}`, digest, Math.ceil(tokens / blockTokens), p.seq);
    publishTransfer(registry, `${id}/${transferId}`, {
      engineId: id,
      mooncakeEngineId: state.mooncakeEngineId,
      hashes,
      digest,
      queueMs: p.queueMs,
      prefillMs: p.prefillMs,
      computedTokens: tokens - p.cachedTokens,
    });
  }
  state.stats.outputTokens++;
  // request_finished returns (delay_free, None): P's answer carries no kv_transfer_params
  return sendJson(res, 200, prefillAnswer(state, ctx, prompts, usageOf(state, tokens, 1, p.cachedTokens), null));
}

/**
 * The decode leg, its kv_transfer_params complete: find P by its bootstrap address, take the
 * blocks at once and pull them once P published the transfer.
 * @param {EngineState} state @param {Call} call
 */
export async function mooncakeDecode(state, call) {
  const { bootstrapTimeoutMs, registry } = state;
  const { res, ctx, prompts, digest, hashes, tokens, maxTokens, kv, rec } = call;
  let source;
  try {
    const u = new URL(String(kv.remote_bootstrap_addr));
    source = [...registry.engines.values()].find((e) => e.running && sameHost(u.hostname, e.host) && Number(u.port || 80) === e.bootstrapPort);
  } catch {
    source = undefined;
  }
  if (!source) {
    state.stats.errors++;
    violation(state, `mooncake decode leg names bootstrap ${kv.remote_bootstrap_addr}: no prefill engine there`);
    return sendError(res, 500, `Mooncake bootstrap query to ${kv.remote_bootstrap_addr} failed`, 'server_error');
  }
  if (source.mooncakeEngineId !== kv.remote_engine_id) {
    // the worker asks P's bootstrap server for remote_engine_id's workers: none registered
    state.stats.errors++;
    violation(state, `mooncake decode leg names remote_engine_id ${kv.remote_engine_id}, ${kv.remote_bootstrap_addr} serves ${source.mooncakeEngineId}`);
    return sendError(res, 500, `KV transfer failed: engine ${kv.remote_engine_id} is not registered at ${kv.remote_bootstrap_addr}`, 'server_error');
  }
  // vLLM schedules the request at once: it takes the blocks (WAITING_FOR_REMOTE_KVS) and
  // its worker pulls them once P has them (mooncake_connector.py)
  const digests = prompts.map(promptDigest);
  const from = source;
  /** @type {{ upstreamMs: number, readyAt: number, computedTokens?: number }} */
  const ready = { upstreamMs: 0, readyAt: 0 };
  return await generate(state, res, ctx, {
    seq: submit(state, 'remote', {
      hashes,
      tokens,
      maxTokens,
      rec,
      freshTokens: () => ready.computedTokens,
      awaitSource: async () => {
        const found = await waitTransfer(registry, `${from.id}/${kv.transfer_id}`, bootstrapTimeoutMs, ctx);
        if (!found) throw Object.assign(new Error(`transfer ${kv.transfer_id}: no prefill arrived within ${bootstrapTimeoutMs} ms`), { status: 504 });
        const h = registry.handles.get(`mc/${from.id}/${kv.transfer_id}`);
        let kvDigest = found.digest;
        if (h?.state !== 'held') {
          state.stats.staleHandleReads++;
          kvDigest = promptDigest(`stale:${kv.transfer_id}`);
        } else h.free('read');
        if (kvDigest !== digest && h?.state === 'read') state.stats.foreignHandleReads++;
        digests[0] = kvDigest;
        Object.assign(ready, { upstreamMs: found.queueMs + found.prefillMs, readyAt: state.time.clock.now(), computedTokens: found.computedTokens });
        return from.id;
      },
    }),
    upstreamMs: 0,
    source: ready,
    usage: usageOf(state, tokens, maxTokens, tokens),
    recordLatency: true,
    digests,
    rec,
  });
}
