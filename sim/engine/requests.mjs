// How the engine's routes put a request into its step loop (sim/model/scheduler.mjs): submit with
// the figures counted on admission (prefix hits, locality misses, the blocks a decode leg pulls),
// seed 000's prefix fetch from another engine, a prefill leg, the KV a P holds for a handle, and
// SGLang's generating /health.
import { Sequence } from '../model/scheduler.mjs';
import { remember } from './registry.mjs';

/**
 * @typedef {import('./state.mjs').EngineState} EngineState
 * @typedef {import('./stats.mjs').RequestStats} RequestStats
 * @typedef {import('./types.mjs').Engine} Engine
 * @typedef {import('./types.mjs').HeldKv} HeldKv
 * @typedef {import('./types.mjs').Ctx} Ctx
 */

/**
 * Seed 000's mesh fetches a held prefix only when it saves at least this many 512-token units
 * (assumed: a decode node that cached its answer holds a unit or so more than the P that
 * prefilled the prompt; seed 000's P+D affinity, whose conversations stay on their P, fetched once)
 */
const PREFIX_FETCH_MIN_UNITS = 2;

/**
 * Blocks this node lacks that another running engine of the registry holds right now.
 * @param {EngineState} state
 * @param {string[]} missing @param {string | undefined} source engine the blocks come from (not a miss)
 */
export function countLocalityMisses(state, missing, source) {
  const { registry, engine } = state;
  let misses = 0;
  for (const hash of missing) {
    for (const other of registry.engines.values()) {
      if (other === engine || other.id === source || !other.running) continue;
      if (other.cache.has(hash)) {
        misses++;
        break;
      }
    }
  }
  state.stats.localityMissBlocks += misses;
  return misses;
}

/**
 * Submit a request to this engine's step loop; its figures are counted once it is admitted
 * (when its prefix hit on this node is known).
 * @param {EngineState} state
 * @param {'local' | 'prefill' | 'remote'} seqKind
 * @param {object} o
 * @param {string[]} o.hashes @param {number} o.tokens @param {number} o.maxTokens
 * @param {Partial<RequestStats>} [o.rec] filled with this request's figures
 * @param {string} [o.source] remote: the engine the KV comes from
 * @param {() => Promise<string>} [o.awaitSource] remote: resolves with the engine the KV comes
 *   from once its prefill is there (SGLang rooms, Mooncake transfers: the decode node takes the
 *   blocks when the request arrives and waits for P); rejecting fails the request
 * @param {() => number | undefined} [o.freshTokens] remote: the prompt tokens P computed for this
 *   request (its suffix), read when the pull starts: that part of the pull is KV P streams as its
 *   prefill's layers finish and stalls neither end; the rest (P's cached context) does, as a mesh
 *   fetch (sim/model/fabric.mjs). Unknown: all of it stalls
 * @param {boolean} [o.hold] prefill: keep the blocks for a handle
 * @returns {Sequence}
 */
export function submit(state, seqKind, { hashes, tokens, maxTokens, rec, source, awaitSource, freshTokens, hold }) {
  const { id, blockTokens, core } = state;
  const seq = new Sequence({
    kind: seqKind,
    hashes,
    promptTokens: tokens,
    maxTokens,
    hold,
    fetchPrefix: seqKind === 'prefill' && state.figures.prefixMesh ? (local) => prefixFetch(state, hashes, local, rec) : undefined,
    load:
      seqKind === 'remote'
        ? async (missing, s, at) => {
            const from = awaitSource ? await awaitSource() : (source ?? '');
            if (awaitSource) {
              const misses = countLocalityMisses(state, hashes.slice(s.hitUnits), from);
              if (rec) Object.assign(rec, { localityMissBlocks: misses, remoteEngineId: from });
            }
            // a pull that waited for its P starts when P is there (now), else at the admitting step
            const fresh = freshTokens?.();
            const held = fresh === undefined ? missing : Math.max(0, missing - fresh);
            const { kvBytesPerToken } = state.figures;
            const r = await state.time.fabric.transfer(from, id, missing * kvBytesPerToken, awaitSource ? undefined : at, held * kvBytesPerToken);
            if (rec) Object.assign(rec, { transferMs: r.ms, transferBytes: r.bytes, crossGroup: r.crossGroup });
            return r;
          }
        : undefined,
    onAdmit: (s) => {
      const hit = s.hitUnits;
      state.stats.promptTokens += tokens;
      state.stats.cachedTokens += s.cachedTokens;
      state.stats.blocksLookedUp += hashes.length;
      state.stats.blocksHit += hit;
      // a decode node waiting for its P counts its locality misses once it knows which P
      const misses = awaitSource ? 0 : countLocalityMisses(state, hashes.slice(hit), source);
      if (rec) Object.assign(rec, { promptTokens: tokens, cachedTokens: s.cachedTokens, blocks: hashes.length, blocksHit: hit, localityMissBlocks: misses });
      if (seqKind !== 'remote') return;
      // D pulls only what it does not hold (vLLM's local prefix hit on the decode node)
      const pulled = Math.max(0, Math.ceil(tokens / blockTokens) - hit);
      const fullRepull = hit === 0 && pulled > 1;
      if (fullRepull) state.stats.fullRepulls++;
      else state.stats.suffixPulls++;
      state.stats.blocksPulled += pulled;
      if (rec) {
        Object.assign(rec, { blocksPulled: pulled, fullRepull });
        if (source !== undefined) rec.remoteEngineId = source;
      }
    },
  });
  return core.submit(seq);
}

/**
 * Seed 000's KV mesh: where another running engine (a P, or even a D) holds a longer prefix of
 * this prompt than this P does, fetch those units from it over the fabric instead of computing
 * them. The holder with the longest prefix serves (at equal length the one sending least, then a
 * P); its NIC
 * egress is shared with its other transfers and its step loop stalls while the bytes leave it
 * (sim/model/fabric.mjs), as this P's does while they land.
 * @param {EngineState} state
 * @param {string[]} hashes @param {number} local units this P holds @param {Partial<RequestStats>} [rec]
 * @returns {import('../model/scheduler.mjs').PrefixFetch | undefined}
 */
function prefixFetch(state, hashes, local, rec) {
  const { id, blockTokens, registry, engine } = state;
  /** @type {Engine | undefined} */
  let holder;
  let units = local;
  // among the holders of the longest prefix, the one whose NIC sends least now (a P's egress
  // carries the KV its decode nodes pull), then a P before a D
  const busy = (/** @type {Engine} */ e) => state.time.fabric.outgoing(e.id) * 2 + (e.role === 'prefill' ? 0 : 1);
  for (const other of registry.engines.values()) {
    if (other === engine || !other.running) continue;
    const m = other.cache.peekMatch(hashes);
    if (m > units || (holder && m === units && busy(other) < busy(holder))) {
      units = m;
      holder = other;
    }
  }
  // a prefix longer by less than PREFIX_FETCH_MIN_UNITS (the answer a decode node cached after
  // the prompt) is computed, not fetched
  if (!holder || units - local < PREFIX_FETCH_MIN_UNITS) return undefined;
  const from = holder.id;
  return {
    units,
    run: async (at) => {
      const r = await state.time.fabric.transfer(from, id, (units - local) * blockTokens * state.figures.kvBytesPerToken, at);
      state.stats.prefixFetches++;
      state.stats.prefixFetchedUnits += units - local;
      if (rec) Object.assign(rec, { prefixFetchFrom: from, prefixFetchedUnits: units - local, prefixFetchMs: r.ms });
      return r;
    },
  };
}

/**
 * A prefill leg: prefill here, one token, then (with `hold`) keep the blocks for a handle.
 * Resolves when the prefill ended (or the request was aborted / refused).
 * @param {EngineState} state
 * @param {string[]} hashes @param {number} tokens @param {Partial<RequestStats>} [rec] @param {boolean} [hold]
 * @param {Ctx} [ctx] a client that leaves aborts it (vLLM cancels the request with its connection)
 */
export async function prefillOnly(state, hashes, tokens, rec, hold = false, ctx) {
  const seq = submit(state, 'prefill', { hashes, tokens, maxTokens: 1, rec, hold });
  if (ctx) ctx.onClose = () => seq.abort();
  await seq.finished;
  const queueMs = seq.admittedAt - seq.arrival;
  const prefillMs = seq.firstTokenAt - seq.admittedAt;
  if (rec && seq.state === 'finished') Object.assign(rec, { queueMs, prefillMs, kvWaitMs: seq.kvWaitMs });
  return { seq, queueMs, prefillMs, cachedTokens: seq.cachedTokens };
}

/**
 * Hold the blocks of a prefill until a D reads them, a D's rejection releases them, or the
 * timeout passes (vllm nixl/scheduler.py request_finished: delay_free_blocks and
 * _reqs_need_send[req] = now + VLLM_NIXL_ABORT_REQUEST_TIMEOUT; freed on the read notification).
 * @param {EngineState} state
 * @param {string} key @param {string} digest @param {number} blocks
 * @param {Sequence} [seq] the finished P leg whose blocks the handle holds in KV memory
 */
export function holdKv(state, key, digest, blocks, seq) {
  const { id, registry, held, core } = state;
  state.stats.issuedHandles++;
  /** @type {HeldKv} */
  const entry = {
    key,
    engineId: id,
    digest,
    blocks,
    state: 'held',
    free(how) {
      if (entry.state !== 'held') return;
      entry.state = how;
      clearTimeout(timer);
      held.delete(key);
      if (seq) core.releaseHeld(seq);
      if (how === 'read') state.stats.consumedHandles++;
      else if (how === 'released') state.stats.releasedHandles++;
      else state.stats.expiredHandles++;
    },
  };
  const timer = setTimeout(() => entry.free('expired'), state.kvHoldTimeoutMs);
  timer.unref?.();
  held.set(key, entry);
  remember(registry.handles, key, entry);
  return entry;
}

/**
 * SGLang-style /health: a one-token generation that waits behind the prefills queued here
 * (sglang srt/entrypoints/http_server.py health_generate; GET /health takes this path unless
 * SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION is off). SGLang returns early when any other request
 * produced output meanwhile; the simulator does not model that shortcut.
 * @param {EngineState} state
 */
export async function healthGeneration(state) {
  state.stats.healthGenerations++;
  // a one-token request through the step loop: it waits its turn behind the queue
  await submit(state, 'local', { hashes: [], tokens: 1, maxTokens: 1 }).finished;
}
