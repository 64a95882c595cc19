// The faults a test injects into a simulated engine (sim/engine/types.mjs FaultMode), as its
// completion routes apply them before they read the request: a broken node, whatever was asked.
import { setTimeout as sleepReal } from 'node:timers/promises';
import { drained, sendError, sseHeaders } from '../wire.mjs';

/**
 * @typedef {import('./state.mjs').EngineState} EngineState
 * @typedef {import('./types.mjs').Ctx} Ctx
 */

/**
 * Apply the engine's injected fault to a completion request, if one is armed: `answered` when the
 * fault answered (or dropped) it, `continue` when the request goes on (perhaps marked in `ctx`).
 * @param {EngineState} state @param {import('node:http').IncomingMessage} req
 * @param {import('node:http').ServerResponse} res @param {string} raw the request body @param {Ctx} ctx
 * @returns {Promise<'answered' | 'continue'>}
 */
export async function applyFault(state, req, res, raw, ctx) {
  const { registry } = state;
  // vLLM >= 0.21 cancels a route whose client hung up before its engine got the request
  // (`with_cancellation` on the OpenAI routes, vllm entrypoints/utils.py), and the cancellation
  // runs _with_kv_transfer_rejection_cleanup's `finally`, which notifies P: a handle such a
  // request carried is freed (the same path as a rejection, below). Here: a request held by a
  // 'hang' or 'slow' fault, before it reached the engine.
  const releaseIfCancelled = () => {
    if (!ctx.closed || !state.rejectionReleasesHandle) return;
    let kvr;
    try {
      kvr = JSON.parse(raw)?.kv_transfer_params;
    } catch {
      return;
    }
    if (!kvr || typeof kvr !== 'object' || kvr.do_remote_prefill !== true || kvr.transfer_id !== undefined) return;
    const h = registry.handles.get(`${kvr.remote_engine_id}/${kvr.remote_request_id}`);
    if (h) h.free('released');
  };

  // faults come first: they model a broken node, whatever the request
  const mode = state.fault.mode;
  if (mode !== 'none' && state.fault.count > 0) {
    state.fault.count--;
    if (state.fault.count <= 0) state.fault = { ...state.fault, mode: 'none' };
    state.stats.faultsInjected++;
    switch (mode) {
      case 'status500':
      case 'status400':
        sendStatusFault(res, mode);
        return 'answered';
      case 'hang':
        // never answer; the 'close' listener counts the client giving up
        if (ctx.closed) releaseIfCancelled();
        else ctx.onClose = releaseIfCancelled;
        return 'answered';
      case 'reset':
        ctx.destroyedByUs = true;
        req.socket.destroy();
        return 'answered';
      case 'slow':
        // a client that leaves while the request waits here is the cancellation above, at once
        ctx.onClose = releaseIfCancelled;
        await sleepReal(state.fault.delayMs);
        if (ctx.closed) return 'answered';
        ctx.onClose = undefined;
        break;
      case 'silent':
        // headers at once, then delayMs of silence before the first body byte: vLLM sends a
        // stream's headers before its first token (a stalled scheduler looks like this)
        if (/"stream"\s*:\s*true/.test(raw)) sseHeaders(res);
        await sleepReal(state.fault.delayMs);
        if (ctx.closed) return 'answered';
        break;
      case 'midstream':
        ctx.destroyAfterChunks = state.fault.afterChunks;
        break;
      case 'eos':
        // a vllm prefill that stopped on EOS: answered, but without kv_transfer_params
        ctx.omitKvTransferParams = true;
        break;
      case 'respond':
        res.writeHead(state.fault.status, state.fault.headers);
        res.end(state.fault.body);
        return 'answered';
      case 'stall':
        ctx.stallAfterChunks = state.fault.afterChunks;
        break;
      case 'flood':
        await flood(res, state.fault.bytes, state.fault.newline);
        return 'answered';
      case 'bigint':
        ctx.bigKvInt = true;
        break;
    }
  }
  return 'continue';
}

/**
 * What a status fault answers, on every route of the engine.
 * @param {import('node:http').ServerResponse} res @param {'status500' | 'status400'} mode
 */
export function sendStatusFault(res, mode) {
  if (mode === 'status500') sendError(res, 500, 'simulated internal error', 'server_error');
  else sendError(res, 400, 'simulated bad request', 'invalid_request_error');
}

/**
 * An SSE answer whose first line (a usage event padded out) is `bytes` long, written at the pace
 * the reader takes it; then `[DONE]` when `newline`, else the stream ends mid-line.
 * @param {import('node:http').ServerResponse} res @param {number} bytes @param {boolean} newline
 */
async function flood(res, bytes, newline) {
  sseHeaders(res);
  const head = 'data: {"object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2},"pad":"';
  res.write(head);
  const piece = 'x'.repeat(64 << 10);
  for (let left = bytes - head.length; left > 0 && !res.destroyed; left -= piece.length) {
    if (!res.write(left >= piece.length ? piece : piece.slice(0, left))) await drained(res);
  }
  if (res.destroyed) return;
  res.end(newline ? '"}\n\ndata: [DONE]\n\n' : '');
}
