// A simulated OpenAI-compatible inference engine (vLLM / SGLang P/D legs or colocated) on
// 127.0.0.1. This file is its HTTP layer and the engines' protocols (KV handles, bootstrap rooms,
// the Mooncake flow, usage, faults, stats); under it runs the engine model of sim/model/: KV
// memory with the prefix cache in it (kv-memory), a continuous-batching step loop (scheduler)
// whose steps take the time the batch costs (step-time), KV transfers over the cluster's links
// (fabric), all on the cluster's simulated clock (clock), with the figures of a preset
// (sim/presets.mjs). GET /metrics serves the real engines' series from that model (model/metrics).
import http from 'node:http';
import { setTimeout as sleepReal } from 'node:timers/promises';
import { createHash, randomUUID } from 'node:crypto';
import { chainedBlockHashes } from './prefix-cache.mjs';
import { lowerHeaders, positiveInt, publish, readBody, sameHost, sendError, sendJson, waitFor } from './wire.mjs';
import { SimClock } from './model/clock.mjs';
import { Fabric } from './model/fabric.mjs';
import { KvMemory } from './model/kv-memory.mjs';
import { EngineCore, Sequence } from './model/scheduler.mjs';
import { hugeMetrics, renderMetrics } from './model/metrics.mjs';
import { resolveModel } from './presets.mjs';

export { sendJson };

/**
 * @typedef {'prefill' | 'decode' | 'both'} EngineRole
 * @typedef {'none' | 'status500' | 'status400' | 'hang' | 'reset' | 'midstream' | 'slow' | 'silent' | 'eos' | 'respond' | 'stall' | 'flood' | 'bigint'} FaultMode
 * `respond`: answer `status` with `headers` and `body`, whatever was asked (a misconfigured or
 * hostile node: 401, 3xx, 204, garbage); `stall`: stop sending after `afterChunks` events (half
 * the body when not streamed) and keep the connection open; `flood`: an SSE answer whose first
 * line is `bytes` long, ended by a newline only when `newline`; `bigint`: a vLLM P whose
 * kv_transfer_params carries `remote_big_id` 12345678901234567890 (beyond 2^53).
 * @typedef {{ mode?: FaultMode, count?: number, delayMs?: number, afterChunks?: number, health?: boolean, status?: number, headers?: Record<string, string>, body?: string, bytes?: number, newline?: boolean }} Fault
 * @typedef {'vllmPrefill' | 'vllmDecode' | 'sglangPrefill' | 'sglangDecode' | 'colocated'} LegKind
 *
 * @typedef {object} EngineOptions
 * @property {string} id
 * @property {EngineRole} role
 * @property {string} [host] default 127.0.0.1
 * @property {number} [port] default 0 (any free port; kept across stop()/start())
 * @property {string[]} [models] default ['sim-model']
 * @property {number} [cacheBlocks] KV memory in 512-token prefix units (the default preset: 5000)
 * @property {number} [blockTokens] prefix-cache unit in tokens, default 512
 * @property {number} [charsPerToken] default 4
 * @property {number} [timeScale] real ms per simulated ms, default 0.001 (0 = no pacing: a discrete-event clock)
 * @property {string} [preset] engine figures (sim/presets.mjs): default | seed000 | seed002
 * @property {'vllm' | 'sglang'} [kind] which engine it is: its /metrics series, and an SGLang decode
 *   node cannot prefill by itself; default vllm
 * @property {'v1' | 'v0'} [vllmMetrics] vLLM /metrics generation (v0: vllm:gpu_cache_usage_perc), default v1
 * @property {'sglang:' | 'sglang_'} [sglangMetricsPrefix] default 'sglang:'
 * @property {string} [group] rack / pdGroup of its network link (transfers across groups are slower)
 * @property {number} [prefillMsPerToken] overrides the preset: linear prefill cost a token
 * @property {number} [transferMsPerBlock] overrides the preset: link time a 512-token block (0 = instant)
 * @property {number} [decodeBaseMs] overrides the preset: a decode step's weight read
 * @property {number} [decodeMsPerSeq] overrides the preset: cost a sequence in a step
 * @property {number} [ingestMsPerBlock] overrides the preset: step time a landed 512-token block costs the receiver
 * @property {number} [transferInterferenceMs] legacy; 0 turns the receiver's cost off
 * @property {number} [numGpuBlocks] KV capacity in blocks of blockSize tokens
 * @property {number} [blockSize] vLLM block_size, default 16
 * @property {number} [maxNumBatchedTokens] default 8192
 * @property {number} [maxNumSeqs] default 1024
 * @property {boolean} [preemption] default true
 * @property {number} [sglangHandshakeTimeoutMs] simulated ms an SGLang decode node tries to reach a
 *   request's missing bootstrap server before failing it (15 attempts 1 s apart), default 15000
 * @property {number} [bootstrapPort] SGLang bootstrap port this engine answers to, default its HTTP port
 * @property {number} [bootstrapTimeoutMs] real ms an SGLang decode leg waits for its prefill, default 30000
 * @property {number} [sampleCap] max samples kept per array, default 100000
 * @property {number} [kvHoldTimeoutMs] real ms a vLLM P holds the blocks of a handle no D read,
 *   default 480000 (VLLM_NIXL_ABORT_REQUEST_TIMEOUT; current vLLM main: 30 s lease, see docs/engines.md)
 * @property {boolean} [rejectionReleasesHandle] a vLLM D that rejects a request carrying a handle
 *   before admission notifies P, which frees it (vLLM >= 0.21, PR #41269), default true
 * @property {boolean} [promptTokensDetails] report prompt_tokens_details (vLLM --enable-prompt-tokens-details), default true
 * @property {number} [sglangAbortGraceMs] real ms before an SGLang P aborts a non-streamed request whose
 *   client left (TokenizerManager._wait_one_response polls is_disconnected every 4 s), default 4000
 * @property {number} [sglangStreamAbortGraceMs] the same for stream:true (Starlette sees the disconnect at once), default 50
 * @property {boolean} [healthGenerate] GET /health runs a one-token generation queued behind prefills,
 *   as SGLang's does (SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION), default false (vLLM's cheap /health)
 * @property {boolean} [rejectDuplicateRequestIds] a second in-flight vLLM request with the same
 *   x-request-id gets 400 "Request id ... already running.", default true
 * @property {string} [mooncakeEngineId] the engine id P's Mooncake bootstrap /query reports, default random
 * @property {Registry} [registry] shared with the other engines of a cluster
 */

/**
 * What engines of one cluster share: who holds which blocks (locality misses), finished
 * prefills by request id (end-to-end simulated TTFT) and SGLang bootstrap rooms.
 * @typedef {object} Registry
 * @property {Map<string, Engine>} engines
 * @property {Map<string, RoomEntry>} rooms
 * @property {Map<string, Set<(entry: RoomEntry) => void>>} roomWaiters
 * @property {Map<string, { queueMs: number, prefillMs: number }>} prefills
 * @property {Map<string, true>} claimedRooms `engineId/room` taken as a prefill leg by a `both` engine
 * @property {Map<string, HeldKv>} handles vLLM KV handles by `remote_engine_id/remote_request_id` (and Mooncake transfers by `mc/engine/transfer_id`)
 * @property {Map<string, TransferEntry>} transfers Mooncake prefills by `engineId/transfer_id`
 * @property {Map<string, Set<(entry: TransferEntry) => void>>} transferWaiters
 * @property {Map<number, { clock: SimClock, fabric: Fabric }>} clocks the cluster's simulated clock and
 *   its network, one per time scale (a cluster normally has one; the test suite mixes two)
 *
 * @typedef {{ key: string, engineId: string, digest: string, blocks: number, state: 'held' | 'read' | 'released' | 'expired', free: (how: 'read' | 'released' | 'expired') => void }} HeldKv
 * @typedef {{ engineId: string, mooncakeEngineId: string, hashes: string[], digest: string, queueMs: number, prefillMs: number }} TransferEntry
 *
 * @typedef {{ engineId: string, host: string, bootstrapPort: number, port: number, hashes: string[], queueMs: number, prefillMs: number, digest?: string, aborted?: boolean }} RoomEntry
 */

/**
 * Seed 000's mesh fetches a held prefix only when it saves at least this many 512-token units
 * (assumed: a decode node that cached its answer holds a unit or so more than the P that
 * prefilled the prompt; seed 000's P+D affinity, whose conversations stay on their P, fetched once)
 */
const PREFIX_FETCH_MIN_UNITS = 2;
const MAX_LOG = 500;
const MAX_REMEMBERED = 10000;
/** per-request figures kept per engine (keyed by x-request-id), oldest dropped first */
const MAX_REQUEST_STATS = 50000;
/**
 * @typedef {Pick<EngineOptions, 'timeScale' | 'prefillMsPerToken' | 'transferMsPerBlock' | 'decodeBaseMs' | 'decodeMsPerSeq' | 'ingestMsPerBlock' | 'kvHoldTimeoutMs' | 'rejectionReleasesHandle' | 'promptTokensDetails' | 'sglangAbortGraceMs' | 'sglangStreamAbortGraceMs' | 'healthGenerate' | 'rejectDuplicateRequestIds' | 'kind' | 'vllmMetrics' | 'sglangMetricsPrefix' | 'maxNumSeqs' | 'maxNumBatchedTokens' | 'preemption' | 'sglangHandshakeTimeoutMs'>} TunableOptions
 */
export const TUNABLE_OPTIONS = [
  'timeScale',
  'prefillMsPerToken',
  'transferMsPerBlock',
  'decodeBaseMs',
  'decodeMsPerSeq',
  'ingestMsPerBlock',
  'maxNumSeqs',
  'maxNumBatchedTokens',
  'preemption',
  'sglangHandshakeTimeoutMs',
  'kvHoldTimeoutMs',
  'rejectionReleasesHandle',
  'promptTokensDetails',
  'sglangAbortGraceMs',
  'sglangStreamAbortGraceMs',
  'healthGenerate',
  'rejectDuplicateRequestIds',
];
/** tunable options that take one of a few strings */
export const STRING_OPTIONS = /** @type {Record<string, string[]>} */ ({
  kind: ['vllm', 'sglang'],
  vllmMetrics: ['v1', 'v0'],
  sglangMetricsPrefix: ['sglang:', 'sglang_'],
});
const FILLER = 'the quick brown fox jumps over a lazy dog while seven bright stars drift across calm northern water'.split(' ');

/** @returns {Registry} */
export function createRegistry() {
  return {
    engines: new Map(),
    rooms: new Map(),
    roomWaiters: new Map(),
    prefills: new Map(),
    claimedRooms: new Map(),
    handles: new Map(),
    transfers: new Map(),
    transferWaiters: new Map(),
    clocks: new Map(),
  };
}

/**
 * The cluster's clock and network for a time scale.
 * @param {Registry} registry @param {number} timeScale
 */
export function clusterTime(registry, timeScale) {
  let entry = registry.clocks.get(timeScale);
  if (!entry) {
    const clock = new SimClock(timeScale);
    entry = { clock, fabric: new Fabric(clock) };
    registry.clocks.set(timeScale, entry);
  }
  return entry;
}

/** @template K, V @param {Map<K, V>} map @param {K} key @param {V} value */
function remember(map, key, value) {
  map.set(key, value);
  if (map.size > MAX_REMEMBERED) map.delete(/** @type {K} */ (map.keys().next().value));
}

function emptyStats() {
  return {
    requests: { total: 0, vllmPrefill: 0, vllmDecode: 0, sglangPrefill: 0, sglangDecode: 0, mooncakePrefill: 0, mooncakeDecode: 0, colocated: 0 },
    promptTokens: 0,
    cachedTokens: 0,
    blocksLookedUp: 0,
    blocksHit: 0,
    localityMissBlocks: 0,
    fullRepulls: 0,
    suffixPulls: 0,
    blocksPulled: 0,
    selfPrefills: 0,
    /** P legs that fetched a held prefix from another engine (presets with prefixMesh) */
    prefixFetches: 0,
    prefixFetchedUnits: 0,
    protocolViolations: 0,
    /** @type {string[]} the last 50 violations, explained */
    violations: [],
    faultsInjected: 0,
    errors: 0,
    clientAborts: 0,
    /** P: handles issued (one per prompt and per sample; only the first is returned) */
    issuedHandles: 0,
    /** P: handles freed because their first D read them */
    consumedHandles: 0,
    /** P: handles freed by a D's rejection notification (the release mechanism) */
    releasedHandles: 0,
    /** P: handles freed by kvHoldTimeoutMs */
    expiredHandles: 0,
    /** D: reads of an unknown, already read, released or expired handle (answered 200, wrong text) */
    staleHandleReads: 0,
    /** D: reads of a live handle made for another prompt (batch prompts 2..N; answered 200, wrong text) */
    foreignHandleReads: 0,
    /** D: requests rejected before admission that carried a handle (404 model, missing prompt) */
    rejectedHandleRequests: 0,
    /** requests refused because the same x-request-id was in flight here */
    duplicateRequestIds: 0,
    /** SGLang P: requests aborted because their client left before the prefill ended */
    sglangAborts: 0,
    /** /health calls that ran a generation */
    healthGenerations: 0,
    outputTokens: 0,
    /** @type {number[]} */ ttftMs: [],
    /** @type {number[]} */ itlMs: [],
    /** @type {number[]} */ tpotMs: [],
  };
}

/**
 * What one engine did for one request (one leg), keyed by its x-request-id: the benchmark
 * joins the P and D records of a request to count, e.g., turns that hit a locality miss.
 * @typedef {object} RequestStats
 * @property {LegKind} leg
 * @property {number} promptTokens
 * @property {number} cachedTokens
 * @property {number} blocks full blocks of the prompt looked up
 * @property {number} blocksHit
 * @property {number} localityMissBlocks blocks missing here that another running node held
 * @property {number} [blocksPulled] decode legs: blocks transferred from P
 * @property {boolean} [fullRepull] decode legs: nothing of the prompt was held here
 * @property {string} [remoteEngineId] vllm decode legs: the P named in kv_transfer_params
 */

/**
 * One request received on a completion route. The SGLang room is cut from the raw text, so a
 * 63-bit integer stays exact; `bootstrapRoomBareInteger` says it was written as a JSON number.
 * @typedef {{ path: string, headers: Record<string, string>, body: string, receivedAt: number, bootstrapRoom?: string, bootstrapRoomBareInteger?: boolean }} RequestLogEntry
 */

/**
 * @typedef {object} Engine
 * @property {string} id
 * @property {EngineRole} role
 * @property {string} url
 * @property {number} port
 * @property {number} bootstrapPort
 * @property {string} host
 * @property {{ has: (h: string) => boolean, match: (h: string[]) => number, peekMatch: (h: string[]) => number, insert: (h: string[]) => void, size: number, clear: () => void }} cache the cached prefix units of its KV memory
 * @property {boolean} running
 * @property {() => ReturnType<typeof emptyStats> & { id: string, role: EngineRole, inflight: number, cacheBlocksUsed: number, running: boolean }} stats
 * @property {() => RequestLogEntry[]} requests
 * @property {() => Record<string, RequestStats>} requestStats figures per x-request-id
 * @property {() => void} reset
 * @property {(values?: { kvUsage?: number, waiting?: number, running?: number }) => string} metrics the /metrics body now
 * @property {(f: { mode?: 'none' | 'override' | 'slow' | 'huge' | 'garbage' | 'status', values?: { kvUsage?: number, waiting?: number, running?: number }, delayMs?: number, status?: number, bytes?: number }) => void} setMetricsFault
 * @property {() => { figures: ReturnType<typeof resolveModel>, memory: KvMemory, core: EngineCore, clock: SimClock, fabric: Fabric }} model
 * @property {(f: Fault) => void} setFault
 * @property {(o: Partial<TunableOptions>) => void} setOptions change tunable options at run time (kept across reset)
 * @property {string} mooncakeEngineId
 * @property {() => Promise<void>} stop
 * @property {() => Promise<void>} start
 * @property {() => Promise<void>} close
 */

/**
 * Start one simulated engine; resolves once it listens.
 * @param {EngineOptions} options
 * @returns {Promise<Engine>}
 */
export async function startEngine(options) {
  let {
    id,
    role,
    host = '127.0.0.1',
    models = ['sim-model'],
    blockTokens = 512,
    charsPerToken = 4,
    timeScale = 0.001,
    bootstrapTimeoutMs = 30000,
    sampleCap = 100000,
    kvHoldTimeoutMs = 480000,
    rejectionReleasesHandle = true,
    promptTokensDetails = true,
    sglangAbortGraceMs = 4000,
    sglangStreamAbortGraceMs = 50,
    healthGenerate = false,
    rejectDuplicateRequestIds = true,
    kind = 'vllm',
    vllmMetrics = 'v1',
    sglangMetricsPrefix = 'sglang:',
    sglangHandshakeTimeoutMs = 15000,
    mooncakeEngineId = `vllm-${randomUUID()}`,
    registry = createRegistry(),
  } = options;
  if (!id) throw new TypeError('engine id is required');
  if (!['prefill', 'decode', 'both'].includes(role)) throw new TypeError(`bad role ${role}`);

  // the engine model: its figures, its KV memory, its step loop, on the cluster's clock and links
  /** @type {Record<string, unknown>} overrides of the preset, kept so a tunable change re-derives the rest */
  const modelOverrides = {};
  for (const k of [
    'preset',
    'cacheBlocks',
    'numGpuBlocks',
    'blockSize',
    'maxNumBatchedTokens',
    'maxNumSeqs',
    'preemption',
    'mfu',
    'mbu',
    'stepOverheadMs',
    'prefillMsPerToken',
    'decodeBaseMs',
    'decodeMsPerSeq',
    'transferMsPerBlock',
    'ingestMsPerBlock',
    'transferInterferenceMs',
    'linkGbps',
    'ingestHbmShare',
    'stallLoadShare',
    'prefixMesh',
  ]) {
    if (/** @type {any} */ (options)[k] !== undefined) modelOverrides[k] = /** @type {any} */ (options)[k];
  }
  let figures = resolveModel({ ...modelOverrides, blockTokens });
  let time = clusterTime(registry, timeScale);
  const memory = new KvMemory({ numBlocks: figures.numGpuBlocks, blockSize: figures.blockSize, unitTokens: blockTokens });
  const core = new EngineCore({
    clock: time.clock,
    memory,
    cost: figures.cost,
    maxNumBatchedTokens: figures.maxNumBatchedTokens,
    maxNumSeqs: figures.maxNumSeqs,
    preemption: figures.preemption,
    stallLoadBytesPerMs: figures.stallLoadBytesPerMs,
    moved: (at) => time.fabric.landed(id, at) + time.fabric.sent(id, at),
  });
  const registerLink = () => {
    time.fabric.configure(figures.fabric);
    time.fabric.register(id, { linkBytesPerMs: figures.linkBytesPerMs, group: options.group });
  };
  registerLink();

  /** @param {Partial<TunableOptions>} o */
  function setOptions(o) {
    if (o.timeScale !== undefined && o.timeScale !== timeScale) {
      timeScale = o.timeScale;
      time = clusterTime(registry, timeScale);
      core.configure({ clock: time.clock });
      registerLink();
    }
    let refigure = false;
    for (const k of ['prefillMsPerToken', 'transferMsPerBlock', 'decodeBaseMs', 'decodeMsPerSeq', 'ingestMsPerBlock', 'maxNumSeqs', 'maxNumBatchedTokens', 'preemption']) {
      const v = /** @type {any} */ (o)[k];
      if (v !== undefined) {
        modelOverrides[k] = v;
        refigure = true;
      }
    }
    if (refigure) {
      figures = resolveModel({ ...modelOverrides, blockTokens });
      core.configure({
        cost: figures.cost,
        maxNumBatchedTokens: figures.maxNumBatchedTokens,
        maxNumSeqs: figures.maxNumSeqs,
        preemption: figures.preemption,
        stallLoadBytesPerMs: figures.stallLoadBytesPerMs,
      });
      registerLink();
    }
    if (o.kvHoldTimeoutMs !== undefined) kvHoldTimeoutMs = o.kvHoldTimeoutMs;
    if (o.rejectionReleasesHandle !== undefined) rejectionReleasesHandle = o.rejectionReleasesHandle;
    if (o.promptTokensDetails !== undefined) promptTokensDetails = o.promptTokensDetails;
    if (o.sglangAbortGraceMs !== undefined) sglangAbortGraceMs = o.sglangAbortGraceMs;
    if (o.sglangStreamAbortGraceMs !== undefined) sglangStreamAbortGraceMs = o.sglangStreamAbortGraceMs;
    if (o.healthGenerate !== undefined) healthGenerate = o.healthGenerate;
    if (o.rejectDuplicateRequestIds !== undefined) rejectDuplicateRequestIds = o.rejectDuplicateRequestIds;
    if (o.sglangHandshakeTimeoutMs !== undefined) sglangHandshakeTimeoutMs = o.sglangHandshakeTimeoutMs;
    if (o.kind !== undefined) kind = o.kind;
    if (o.vllmMetrics !== undefined) vllmMetrics = o.vllmMetrics;
    if (o.sglangMetricsPrefix !== undefined) sglangMetricsPrefix = o.sglangMetricsPrefix;
  }
  /** The prefix cache as the rest of the simulator reads it: the cached units of the KV memory. */
  const cache = {
    has: (/** @type {string} */ h) => memory.has(h),
    peekMatch: (/** @type {string[]} */ hashes) => memory.lookup(hashes),
    match(/** @type {string[]} */ hashes) {
      const hit = memory.lookup(hashes);
      memory.touch(hashes.slice(0, hit));
      return hit;
    },
    insert: (/** @type {string[]} */ hashes) => memory.insertReady(hashes),
    get size() {
      return memory.cachedUnits();
    },
    clear: () => memory.clear(),
  };
  /** KV blocks this P holds for handles no D has read yet, by handle key */
  /** @type {Map<string, HeldKv>} */
  const held = new Map();
  /** x-request-ids of the requests in flight here */
  /** @type {Set<string>} */
  const inflightIds = new Set();
  let internalCounter = 0;

  /**
   * Hold the blocks of a prefill until a D reads them, a D's rejection releases them, or the
   * timeout passes (vllm nixl/scheduler.py request_finished: delay_free_blocks and
   * _reqs_need_send[req] = now + VLLM_NIXL_ABORT_REQUEST_TIMEOUT; freed on the read notification).
   * @param {string} key @param {string} digest @param {number} blocks
   * @param {Sequence} [seq] the finished P leg whose blocks the handle holds in KV memory
   */
  function holdKv(key, digest, blocks, seq) {
    stats.issuedHandles++;
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
        if (how === 'read') stats.consumedHandles++;
        else if (how === 'released') stats.releasedHandles++;
        else stats.expiredHandles++;
      },
    };
    const timer = setTimeout(() => entry.free('expired'), kvHoldTimeoutMs);
    timer.unref?.();
    held.set(key, entry);
    remember(registry.handles, key, entry);
    return entry;
  }
  let stats = emptyStats();
  /** @type {RequestLogEntry[]} */
  let log = [];
  /** @type {Map<string, RequestStats>} */
  let requestStats = new Map();
  /** @type {Required<Fault>} */
  let fault = { mode: 'none', count: Infinity, delayMs: 0, afterChunks: 2, health: true, status: 200, headers: {}, body: '', bytes: 0, newline: true };
  let inflight = 0;
  let completionCounter = 0;
  /** @type {{ mode: 'none' | 'override' | 'slow' | 'huge' | 'garbage' | 'status', values: { kvUsage?: number, waiting?: number, running?: number }, delayMs: number, status: number, bytes: number }} */
  let metricsFault = { mode: 'none', values: {}, delayMs: 5000, status: 500, bytes: 10_000_000 };
  /** @type {Set<import('node:net').Socket>} */
  const sockets = new Set();

  /** @param {number[]} arr @param {number} value */
  function sample(arr, value) {
    if (arr.length < sampleCap) arr.push(value);
  }
  /** @param {string} why */
  function violation(why) {
    stats.protocolViolations++;
    stats.violations.push(why);
    if (stats.violations.length > 50) stats.violations.shift();
  }

  /**
   * Blocks this node lacks that another running engine of the registry holds right now.
   * @param {string[]} missing @param {string | undefined} source engine the blocks come from (not a miss)
   */
  function countLocalityMisses(missing, source) {
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
    stats.localityMissBlocks += misses;
    return misses;
  }

  /**
   * Submit a request to this engine's step loop; its figures are counted once it is admitted
   * (when its prefix hit on this node is known).
   * @param {'local' | 'prefill' | 'remote'} seqKind
   * @param {object} o
   * @param {string[]} o.hashes @param {number} o.tokens @param {number} o.maxTokens
   * @param {Partial<RequestStats>} [o.rec] filled with this request's figures
   * @param {string} [o.source] remote: the engine the KV comes from
   * @param {() => Promise<string>} [o.awaitSource] remote: resolves with the engine the KV comes
   *   from once its prefill is there (SGLang rooms, Mooncake transfers: the decode node takes the
   *   blocks when the request arrives and waits for P); rejecting fails the request
   * @param {boolean} [o.hold] prefill: keep the blocks for a handle
   * @returns {Sequence}
   */
  function submit(seqKind, { hashes, tokens, maxTokens, rec, source, awaitSource, hold }) {
    const seq = new Sequence({
      kind: seqKind,
      hashes,
      promptTokens: tokens,
      maxTokens,
      hold,
      fetchPrefix: seqKind === 'prefill' && figures.prefixMesh ? (local) => prefixFetch(hashes, local, rec) : undefined,
      load:
        seqKind === 'remote'
          ? async (missing, s, at) => {
              const from = awaitSource ? await awaitSource() : (source ?? '');
              if (awaitSource) {
                const misses = countLocalityMisses(hashes.slice(s.hitUnits), from);
                if (rec) Object.assign(rec, { localityMissBlocks: misses, remoteEngineId: from });
              }
              // a pull that waited for its P starts when P is there (now), else at the admitting step
              const r = await time.fabric.transfer(from, id, missing * figures.kvBytesPerToken, awaitSource ? undefined : at);
              if (rec) Object.assign(rec, { transferMs: r.ms, transferBytes: r.bytes, crossGroup: r.crossGroup });
              return r;
            }
          : undefined,
      onAdmit: (s) => {
        const hit = s.hitUnits;
        stats.promptTokens += tokens;
        stats.cachedTokens += s.cachedTokens;
        stats.blocksLookedUp += hashes.length;
        stats.blocksHit += hit;
        // a decode node waiting for its P counts its locality misses once it knows which P
        const misses = awaitSource ? 0 : countLocalityMisses(hashes.slice(hit), source);
        if (rec) Object.assign(rec, { promptTokens: tokens, cachedTokens: s.cachedTokens, blocks: hashes.length, blocksHit: hit, localityMissBlocks: misses });
        if (seqKind !== 'remote') return;
        // D pulls only what it does not hold (vLLM's local prefix hit on the decode node)
        const pulled = Math.max(0, Math.ceil(tokens / blockTokens) - hit);
        const fullRepull = hit === 0 && pulled > 1;
        if (fullRepull) stats.fullRepulls++;
        else stats.suffixPulls++;
        stats.blocksPulled += pulled;
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
   * @param {string[]} hashes @param {number} local units this P holds @param {Partial<RequestStats>} [rec]
   * @returns {import('./model/scheduler.mjs').PrefixFetch | undefined}
   */
  function prefixFetch(hashes, local, rec) {
    /** @type {Engine | undefined} */
    let holder;
    let units = local;
    // among the holders of the longest prefix, the one whose NIC sends least now (a P's egress
    // carries the KV its decode nodes pull), then a P before a D
    const busy = (/** @type {Engine} */ e) => time.fabric.outgoing(e.id) * 2 + (e.role === 'prefill' ? 0 : 1);
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
        const r = await time.fabric.transfer(from, id, (units - local) * blockTokens * figures.kvBytesPerToken, at);
        stats.prefixFetches++;
        stats.prefixFetchedUnits += units - local;
        if (rec) Object.assign(rec, { prefixFetchFrom: from, prefixFetchedUnits: units - local, prefixFetchMs: r.ms });
        return r;
      },
    };
  }

  /**
   * A prefill leg: prefill here, one token, then (with `hold`) keep the blocks for a handle.
   * Resolves when the prefill ended (or the request was aborted / refused).
   * @param {string[]} hashes @param {number} tokens @param {Partial<RequestStats>} [rec] @param {boolean} [hold]
   * @param {Ctx} [ctx] a client that leaves aborts it (vLLM cancels the request with its connection)
   */
  async function prefillOnly(hashes, tokens, rec, hold = false, ctx) {
    const seq = submit('prefill', { hashes, tokens, maxTokens: 1, rec, hold });
    if (ctx) ctx.onClose = () => seq.abort();
    await seq.finished;
    const queueMs = seq.admittedAt - seq.arrival;
    const prefillMs = seq.firstTokenAt - seq.admittedAt;
    if (rec && seq.state === 'finished') Object.assign(rec, { queueMs, prefillMs, kvWaitMs: seq.kvWaitMs });
    return { seq, queueMs, prefillMs, cachedTokens: seq.cachedTokens };
  }

  /**
   * The error a refused or failed sequence gets: JSON before any byte went out, else (a stream
   * whose headers are out) an error event, as vLLM and SGLang stream errors.
   * @param {http.ServerResponse} res @param {Sequence} seq
   */
  function refuse(res, seq) {
    if (seq.error === 'too_long') {
      // vLLM checks the prompt against max_model_len, which its KV cache can always hold
      const message = `This model's maximum context length is ${figures.numGpuBlocks * figures.blockSize} tokens. However, you requested ${seq.promptTokens} tokens.`;
      return sendError(res, 400, message, 'BadRequestError');
    }
    stats.errors++;
    const status = seq.errorStatus ?? 500;
    const message = seq.error ?? 'aborted';
    const type = /KVTransferError/.test(message) ? 'InternalServerError' : 'server_error';
    if (!res.headersSent) return sendError(res, status, message, type);
    if (res.destroyed) return;
    res.end(`data: ${JSON.stringify({ error: { message, type, param: null, code: status } })}\n\ndata: [DONE]\n\n`);
  }

  /**
   * Stream or answer the tokens of a sequence (one flushed SSE event per token, or one JSON body).
   * @param {http.ServerResponse} res
   * @param {Ctx} ctx
   * The first word of each choice is a digest of the prompt whose KV the answer was computed on
   * (`promptDigest`), so a test can tell an answer that belongs to another prompt.
   * @param {{ seq: Sequence, upstreamMs: number, source?: { upstreamMs: number, readyAt: number }, usage: object | (() => object), recordLatency: boolean, digests: string[], rec?: Partial<RequestStats> }} gen
   *   upstreamMs: simulated ms before this engine got the request that belong to its TTFT (its P's queue and prefill);
   *   source: a decode leg that waited here for its P: P's queue and prefill, and when P's KV was ready (this engine's clock)
   */
  async function generate(res, ctx, gen) {
    const { chat, stream, model } = ctx;
    const { seq } = gen;
    const idStr = `${chat ? 'chatcmpl' : 'cmpl'}-${id}-${++completionCounter}`;
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
    for (let i = 0; i < outputTokens; i++) {
      const token = await seq.next();
      if (!token) {
        if (seq.state === 'failed' && !ctx.closed) return refuse(res, seq);
        if (!res.destroyed && res.headersSent) res.destroy();
        return;
      }
      if (res.destroyed) return seq.abort();
      if (i > 0 && gen.recordLatency) sample(stats.itlMs, token.at - previousAt);
      previousAt = token.at;
      let data = '';
      for (let c = 0; c < choicesN; c++) {
        const word = i === 0 ? digests[c] : ' ' + FILLER[(i + completionCounter) % FILLER.length];
        texts[c].push(word);
        stats.outputTokens++;
        if (!stream) continue;
        const last = i === outputTokens - 1;
        const finish = last ? 'length' : null;
        const chunk = chat
          ? {
              id: idStr,
              object: 'chat.completion.chunk',
              created,
              model,
              choices: [{ index: c, delta: i === 0 ? { role: 'assistant', content: word } : { content: word }, logprobs: null, finish_reason: finish }],
            }
          : { id: idStr, object: 'text_completion', created, model, choices: [{ index: c, text: word, logprobs: null, finish_reason: finish }] };
        data += `data: ${JSON.stringify(chunk)}\n\n`;
      }
      if (stream) {
        chunksSent++;
        if (ctx.stallAfterChunks !== undefined && chunksSent >= ctx.stallAfterChunks) {
          // silent from here on, connection open, until the client gives up
          res.write(data);
          return await untilClosed(ctx);
        }
        if (ctx.destroyAfterChunks !== undefined && chunksSent >= ctx.destroyAfterChunks) {
          // let the chunks reach the client first, so it sees a stream that breaks, not none
          seq.abort();
          await new Promise((resolve) => res.write(data, () => resolve(undefined)));
          await sleepReal(10);
          ctx.destroyedByUs = true;
          res.socket?.destroy();
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
      sample(stats.ttftMs, ttftMs);
      if (outputTokens > 1) sample(stats.tpotMs, tpotMs);
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
      await new Promise((resolve) => res.write(json.slice(0, Math.floor(json.length / 2)), () => resolve(undefined)));
      await sleepReal(10);
      ctx.destroyedByUs = true;
      res.socket?.destroy();
      return;
    }
    sendJson(res, 200, body);
  }

  /**
   * @typedef {{ chat: boolean, stream: boolean, model: string, includeUsage: boolean, samples?: number, destroyAfterChunks?: number, stallAfterChunks?: number, bigKvInt?: boolean, destroyedByUs: boolean, closed: boolean, omitKvTransferParams?: boolean, onClose?: () => void, promptText?: string }} Ctx
   */

  /** @param {string | number[]} q */
  function tokensOf(q) {
    return typeof q === 'string' ? Math.ceil(q.length / charsPerToken) : q.length;
  }

  /**
   * A prefill leg's JSON answer: one token a prompt (each the prompt's digest), plus the handle.
   * @param {Ctx} ctx @param {(string | number[])[]} prompts @param {object} usage @param {Record<string, unknown> | null | undefined} params
   */
  function prefillAnswer(ctx, prompts, usage, params) {
    const idStr = `${ctx.chat ? 'chatcmpl' : 'cmpl'}-${id}-${++completionCounter}`;
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
   * SGLang-style /health: a one-token generation that waits behind the prefills queued here
   * (sglang srt/entrypoints/http_server.py health_generate; GET /health takes this path unless
   * SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION is off). SGLang returns early when any other request
   * produced output meanwhile; the simulator does not model that shortcut.
   */
  async function healthGeneration() {
    stats.healthGenerations++;
    // a one-token request through the step loop: it waits its turn behind the queue
    await submit('local', { hashes: [], tokens: 1, maxTokens: 1 }).finished;
  }

  /** @param {number} promptTokens @param {number} completionTokens @param {number} cachedTokens */
  function usageOf(promptTokens, completionTokens, cachedTokens) {
    // vllm serving_completion.py / serving_chat.py: `if self.enable_prompt_tokens_details and
    // final_res.num_cached_tokens:` — the field is left out when the count is 0 (or the flag is off).
    /** @type {Record<string, unknown>} */
    const usage = { prompt_tokens: promptTokens, completion_tokens: completionTokens, total_tokens: promptTokens + completionTokens };
    if (promptTokensDetails && cachedTokens > 0) usage.prompt_tokens_details = { cached_tokens: cachedTokens };
    return usage;
  }

  /** @param {http.IncomingMessage} req @param {http.ServerResponse} res @param {string} path */
  async function handleCompletion(req, res, path) {
    inflight++;
    stats.requests.total++;
    /** @type {Ctx} */
    const ctx = { chat: path === '/v1/chat/completions', stream: false, model: models[0], includeUsage: false, destroyedByUs: false, closed: false };
    res.on('close', () => {
      inflight--;
      ctx.closed = true;
      ctx.onClose?.();
      if (!res.writableFinished && !ctx.destroyedByUs) stats.clientAborts++;
    });
    const raw = await readBody(req);
    const roomMatch = /"bootstrap_room"\s*:\s*(-?\d+|"[^"]*")/.exec(raw);
    /** @type {RequestLogEntry} */
    const entry = { path, headers: lowerHeaders(req.headers), body: raw, receivedAt: Date.now() };
    if (roomMatch) {
      entry.bootstrapRoom = roomMatch[1].replace(/"/g, '');
      entry.bootstrapRoomBareInteger = !roomMatch[1].startsWith('"');
    }
    log.push(entry);
    if (log.length > MAX_LOG) log.shift();

    // vLLM >= 0.21 cancels a route whose client hung up before its engine got the request
    // (`with_cancellation` on the OpenAI routes, vllm entrypoints/utils.py), and the cancellation
    // runs _with_kv_transfer_rejection_cleanup's `finally`, which notifies P: a handle such a
    // request carried is freed (the same path as a rejection, below). Here: a request held by a
    // 'hang' or 'slow' fault, before it reached the engine.
    const releaseIfCancelled = () => {
      if (!ctx.closed || !rejectionReleasesHandle) return;
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
    const mode = fault.mode;
    if (mode !== 'none' && fault.count > 0) {
      fault.count--;
      if (fault.count <= 0) fault = { ...fault, mode: 'none' };
      stats.faultsInjected++;
      switch (mode) {
        case 'status500':
          return sendError(res, 500, 'simulated internal error', 'server_error');
        case 'status400':
          return sendError(res, 400, 'simulated bad request', 'invalid_request_error');
        case 'hang':
          // never answer; the 'close' listener counts the client giving up
          if (ctx.closed) releaseIfCancelled();
          else ctx.onClose = releaseIfCancelled;
          return;
        case 'reset':
          ctx.destroyedByUs = true;
          req.socket.destroy();
          return;
        case 'slow':
          // a client that leaves while the request waits here is the cancellation above, at once
          ctx.onClose = releaseIfCancelled;
          await sleepReal(fault.delayMs);
          if (ctx.closed) return;
          ctx.onClose = undefined;
          break;
        case 'silent':
          // headers at once, then delayMs of silence before the first body byte: vLLM sends a
          // stream's headers before its first token (a stalled scheduler looks like this)
          if (/"stream"\s*:\s*true/.test(raw)) sseHeaders(res);
          await sleepReal(fault.delayMs);
          if (ctx.closed) return;
          break;
        case 'midstream':
          ctx.destroyAfterChunks = fault.afterChunks;
          break;
        case 'eos':
          // a vllm prefill that stopped on EOS: answered, but without kv_transfer_params
          ctx.omitKvTransferParams = true;
          break;
        case 'respond':
          res.writeHead(fault.status, fault.headers);
          res.end(fault.body);
          return;
        case 'stall':
          ctx.stallAfterChunks = fault.afterChunks;
          break;
        case 'flood':
          return flood(res, fault.bytes, fault.newline);
        case 'bigint':
          ctx.bigKvInt = true;
          break;
      }
    }

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
        stats.rejectedHandleRequests++;
        const key = kvr.transfer_id !== undefined ? undefined : `${kvr.remote_engine_id}/${kvr.remote_request_id}`;
        const h = key === undefined ? undefined : registry.handles.get(key);
        if (h && rejectionReleasesHandle) h.free('released');
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
    ctx.includeUsage = ctx.stream && body.stream_options?.include_usage === true;
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
    if (requestId && !isRoom && rejectDuplicateRequestIds) {
      if (inflightIds.has(requestId)) {
        stats.duplicateRequestIds++;
        return sendError(res, 400, `Request id ${requestId} already running.`, 'invalid_request_error');
      }
      inflightIds.add(requestId);
      res.on('close', () => inflightIds.delete(requestId));
    }
    /** @type {Partial<RequestStats>} */
    const rec = {};
    if (requestId) {
      requestStats.delete(requestId);
      requestStats.set(requestId, rec);
      if (requestStats.size > MAX_REQUEST_STATS) requestStats.delete(/** @type {string} */ (requestStats.keys().next().value));
    }

    try {
      if (isRoom) {
        const room = entry.bootstrapRoom ?? '';
        const bHost = String(body.bootstrap_host ?? '');
        const bPort = Number(body.bootstrap_port);
        // a `both` engine takes the prefill leg of a room that names it, the first time it sees it
        const namesMe = sameHost(bHost, host) && bPort === engine.bootstrapPort;
        const isPrefillLeg = role === 'prefill' || (role === 'both' && namesMe && !registry.claimedRooms.has(`${id}/${room}`));
        if (isPrefillLeg) {
          if (role === 'both') remember(registry.claimedRooms, `${id}/${room}`, true);
          stats.requests.sglangPrefill++;
          if (!namesMe) {
            violation(`sglang prefill leg names bootstrap ${bHost}:${bPort}, this node is ${host}:${engine.bootstrapPort}`);
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
          const seq = submit('prefill', { hashes, tokens, maxTokens: 1, rec });
          ctx.onClose = () => {
            if (done) return;
            abortTimer = setTimeout(
              () => {
                if (done) return;
                aborted = true;
                stats.sglangAborts++;
                seq.abort();
                publishRoom(registry, room, { engineId: id, host, bootstrapPort: engine.bootstrapPort, port: engine.port, hashes: [], queueMs: 0, prefillMs: 0, aborted: true });
              },
              ctx.stream ? sglangStreamAbortGraceMs : sglangAbortGraceMs,
            );
            abortTimer.unref?.();
          };
          await seq.finished;
          done = true;
          clearTimeout(abortTimer);
          if (aborted) return;
          if (seq.state !== 'finished') {
            publishRoom(registry, room, { engineId: id, host, bootstrapPort: engine.bootstrapPort, port: engine.port, hashes: [], queueMs: 0, prefillMs: 0, aborted: true });
            return refuse(res, seq);
          }
          const queueMs = seq.admittedAt - seq.arrival;
          const prefillMs = seq.firstTokenAt - seq.admittedAt;
          Object.assign(rec, { queueMs, prefillMs, kvWaitMs: seq.kvWaitMs });
          publishRoom(registry, room, { engineId: id, host, bootstrapPort: engine.bootstrapPort, port: engine.port, hashes, queueMs, prefillMs, digest });
          return await generate(res, ctx, {
            seq,
            upstreamMs: 0,
            usage: usageOf(tokens, 1, seq.cachedTokens),
            recordLatency: false,
            digests: prompts.map(promptDigest),
          });
        }
        stats.requests.sglangDecode++;
        rec.leg = 'sglangDecode';
        // SGLang's decode node takes a request into its PreallocQueue at once: it reserves the KV
        // blocks, then the prefill's sender fills them (srt/disaggregation/decode.py)
        const digests = prompts.map(promptDigest);
        const source = { upstreamMs: 0, readyAt: 0 };
        const seq = submit('remote', {
          hashes,
          tokens,
          maxTokens,
          rec,
          awaitSource: async () => {
            const found = await waitRoom(registry, room, bootstrapTimeoutMs, ctx);
            if (!found) throw Object.assign(new Error(`bootstrap room ${room}: no prefill arrived within ${bootstrapTimeoutMs} ms`), { status: 504 });
            if (found.aborted) throw Object.assign(new Error(`KVTransferError(bootstrap_room=${room}): Aborted by AbortReq`), { status: 500 });
            if (!sameHost(bHost, found.host) || bPort !== found.bootstrapPort) {
              violation(`sglang decode leg names bootstrap ${bHost}:${bPort} but room ${room} was prefilled on ${found.host}:${found.bootstrapPort}`);
              throw Object.assign(new Error(`bootstrap room ${room} was not prefilled on ${bHost}:${bPort}`), { status: 502 });
            }
            digests[0] = found.digest ?? digest;
            if (digests[0] !== digest) stats.foreignHandleReads++;
            Object.assign(source, { upstreamMs: found.queueMs + found.prefillMs, readyAt: time.clock.now() });
            return found.engineId;
          },
        });
        return await generate(res, ctx, {
          seq,
          upstreamMs: 0,
          source,
          usage: usageOf(tokens, maxTokens, tokens),
          recordLatency: true,
          digests,
          rec,
        });
      }

      // vLLM MooncakeConnector flow (vllm examples/disaggregated/mooncake_connector/mooncake_connector_proxy.py,
      // kv_connector/v1/mooncake/mooncake_connector.py): a router-made transfer_id on both legs.
      if (kv && typeof kv === 'object' && kv.transfer_id !== undefined && kv.do_remote_decode === true) {
        stats.requests.mooncakePrefill++;
        rec.leg = 'mooncakePrefill';
        const p = await prefillOnly(hashes, tokens, rec, Boolean(kv.transfer_id), ctx);
        if (ctx.closed) return;
        if (p.seq.state !== 'finished') return refuse(res, p.seq);
        if (requestId) remember(registry.prefills, requestId, { queueMs: p.queueMs, prefillMs: p.prefillMs });
        const transferId = String(kv.transfer_id);
        if (!kv.transfer_id) {
          // update_state_after_alloc: "Missing transfer_id in kv_transfer_params from router!" — never sent
          violation('mooncake prefill leg without transfer_id');
        } else {
          // request_finished: delay_free_blocks until D pulls (the worker frees on the send's end)
          holdKv(`mc/${id}/${transferId}`, digest, Math.ceil(tokens / blockTokens), p.seq);
          publishTransfer(registry, `${id}/${transferId}`, { engineId: id, mooncakeEngineId, hashes, digest, queueMs: p.queueMs, prefillMs: p.prefillMs });
        }
        stats.outputTokens++;
        // request_finished returns (delay_free, None): P's answer carries no kv_transfer_params
        return sendJson(res, 200, prefillAnswer(ctx, prompts, usageOf(tokens, 1, p.cachedTokens), null));
      }
      if (kv && typeof kv === 'object' && kv.transfer_id !== undefined && kv.do_remote_prefill === true) {
        stats.requests.mooncakeDecode++;
        rec.leg = 'mooncakeDecode';
        const missing = ['remote_engine_id', 'remote_bootstrap_addr', 'transfer_id'].filter((f) => kv[f] === undefined || kv[f] === null || kv[f] === '');
        if (missing.length === 0) {
          let source;
          try {
            const u = new URL(String(kv.remote_bootstrap_addr));
            source = [...registry.engines.values()].find((e) => e.running && sameHost(u.hostname, e.host) && Number(u.port || 80) === e.bootstrapPort);
          } catch {
            source = undefined;
          }
          if (!source) {
            stats.errors++;
            violation(`mooncake decode leg names bootstrap ${kv.remote_bootstrap_addr}: no prefill engine there`);
            return sendError(res, 500, `Mooncake bootstrap query to ${kv.remote_bootstrap_addr} failed`, 'server_error');
          }
          if (source.mooncakeEngineId !== kv.remote_engine_id) {
            // the worker asks P's bootstrap server for remote_engine_id's workers: none registered
            stats.errors++;
            violation(`mooncake decode leg names remote_engine_id ${kv.remote_engine_id}, ${kv.remote_bootstrap_addr} serves ${source.mooncakeEngineId}`);
            return sendError(res, 500, `KV transfer failed: engine ${kv.remote_engine_id} is not registered at ${kv.remote_bootstrap_addr}`, 'server_error');
          }
          // vLLM schedules the request at once: it takes the blocks (WAITING_FOR_REMOTE_KVS) and
          // its worker pulls them once P has them (mooncake_connector.py)
          const digests = prompts.map(promptDigest);
          const from = source;
          const ready = { upstreamMs: 0, readyAt: 0 };
          return await generate(res, ctx, {
            seq: submit('remote', {
              hashes,
              tokens,
              maxTokens,
              rec,
              awaitSource: async () => {
                const found = await waitTransfer(registry, `${from.id}/${kv.transfer_id}`, bootstrapTimeoutMs, ctx);
                if (!found) throw Object.assign(new Error(`transfer ${kv.transfer_id}: no prefill arrived within ${bootstrapTimeoutMs} ms`), { status: 504 });
                const h = registry.handles.get(`mc/${from.id}/${kv.transfer_id}`);
                let kvDigest = found.digest;
                if (h?.state !== 'held') {
                  stats.staleHandleReads++;
                  kvDigest = promptDigest(`stale:${kv.transfer_id}`);
                } else h.free('read');
                if (kvDigest !== digest && h?.state === 'read') stats.foreignHandleReads++;
                digests[0] = kvDigest;
                Object.assign(ready, { upstreamMs: found.queueMs + found.prefillMs, readyAt: time.clock.now() });
                return from.id;
              },
            }),
            upstreamMs: 0,
            source: ready,
            usage: usageOf(tokens, maxTokens, tokens),
            recordLatency: true,
            digests,
            rec,
          });
        }
        // "Got invalid KVTransferParams ... will not utilize KVTransfer": D prefills by itself
        violation(`mooncake decode leg without ${missing.join(', ')}`);
      }

      if (kv && typeof kv === 'object' && kv.do_remote_decode === true && kv.transfer_id === undefined) {
        stats.requests.vllmPrefill++;
        if (body.stream === true) violation('vllm prefill leg has stream:true');
        if (body.max_tokens !== undefined && body.max_tokens !== 1) violation(`vllm prefill leg has max_tokens:${JSON.stringify(body.max_tokens)}`);
        if (body.max_tokens === undefined && body.max_completion_tokens === undefined) violation('vllm prefill leg has no max_tokens:1');
        if (body.max_completion_tokens !== undefined && body.max_completion_tokens !== 1)
          violation(`vllm prefill leg has max_completion_tokens:${JSON.stringify(body.max_completion_tokens)}`);
        for (const field of ['stream_options', 'min_tokens', 'min_completion_tokens']) {
          if (body[field] !== undefined) violation(`vllm prefill leg has ${field}`);
        }
        rec.leg = 'vllmPrefill';
        // P keeps the blocks of a handle until a decode node read them (nixl delay_free_blocks)
        const p = await prefillOnly(hashes, tokens, rec, !ctx.omitKvTransferParams, ctx);
        // A client gone before the answer cancels the handler (vllm entrypoints/utils.py
        // with_cancellation) and aborts the request: its blocks are freed at once, no handle.
        if (ctx.closed) {
          core.releaseHeld(p.seq);
          return;
        }
        if (p.seq.state !== 'finished') return refuse(res, p.seq);
        if (requestId) remember(registry.prefills, requestId, { queueMs: p.queueMs, prefillMs: p.prefillMs });
        const totalBlocks = Math.ceil(tokens / blockTokens);
        stats.outputTokens += prompts.length;
        /** @type {Record<string, unknown> | undefined} */
        let params;
        if (!ctx.omitKvTransferParams) {
          // Every sub-request (one per prompt, and per sample when n > 1: vllm v1/engine/parallel_sampling.py
          // fans n out into child requests) ends length-capped and holds its blocks; the response
          // carries one kv_transfer_params only — serving_completion.py takes
          // final_res_batch[0].kv_transfer_params — so the others stay held until the timeout.
          const samples = positiveInt(body.n) ?? 1;
          const base = `cmpl-${requestId ?? randomUUID()}-${++internalCounter}`;
          /** @type {string[]} */
          const ids = [];
          prompts.forEach((q, i) => {
            for (let s = 0; s < samples; s++) {
              const remoteRequestId = `${base}-${i}${samples > 1 ? `-${s}` : ''}`;
              ids.push(remoteRequestId);
              // the first handle holds the prefill's blocks in KV memory (the others: the simulator prefills prompt 1 only)
              holdKv(`${id}/${remoteRequestId}`, promptDigest(q), i === 0 ? totalBlocks : Math.ceil(tokensOf(q) / blockTokens), i === 0 && s === 0 ? p.seq : undefined);
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
          const text = JSON.stringify(prefillAnswer(ctx, prompts, usageOf(tokens, 1, p.cachedTokens), params)).replace(
            '"remote_engine_id":',
            '"remote_big_id":12345678901234567890,"remote_engine_id":',
          );
          res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
          return res.end(text);
        }
        return sendJson(res, 200, prefillAnswer(ctx, prompts, usageOf(tokens, 1, p.cachedTokens), params));
      }

      if (kv && typeof kv === 'object' && kv.do_remote_prefill === true) {
        stats.requests.vllmDecode++;
        if (typeof kv.remote_engine_id !== 'string') violation('vllm decode leg without remote_engine_id');
        for (const field of ['remote_block_ids', 'remote_host', 'remote_port', 'remote_request_id']) {
          if (kv[field] === undefined || kv[field] === null) violation(`vllm decode leg without kv_transfer_params.${field}`);
        }
        const source = typeof kv.remote_engine_id === 'string' ? kv.remote_engine_id : undefined;
        const remote = source === undefined ? undefined : registry.engines.get(source);
        if (source !== undefined && registry.engines.size > 1 && !remote) violation(`vllm decode leg names unknown remote_engine_id ${source}`);
        if (remote && kv.remote_port !== undefined && kv.remote_port !== null && kv.remote_port !== remote.port) {
          violation(`vllm decode leg names remote_port ${kv.remote_port}, engine ${source} listens on ${remote.port}`);
        }
        // A handle is single-use: P frees its blocks on the first read's notification
        // (nixl worker.py _get_new_notifs -> finished_sending), or at the timeout/lease end, and
        // later reads are only logged ("Potentially invalid KV blocks for unrecognized request ...
        // were retrieved by a decode worker"): D answers 200 from blocks that now hold something else.
        const h = registry.handles.get(`${source}/${kv.remote_request_id}`);
        /** @type {string[]} */
        const digests = [];
        if (h?.state !== 'held') {
          stats.staleHandleReads += prompts.length;
          for (let i = 0; i < prompts.length; i++) digests.push(promptDigest(`stale:${source}/${kv.remote_request_id}/${i}`));
        } else {
          h.free('read');
          // every prompt of a batch reads the same handle: prompts 2..N decode on prompt 1's KV
          prompts.forEach((q) => {
            if (promptDigest(q) !== h.digest) stats.foreignHandleReads++;
            digests.push(h.digest);
          });
        }
        const upstream = requestId ? registry.prefills.get(requestId) : undefined;
        rec.leg = 'vllmDecode';
        // D counts the KV it pulled as cached (num_cached_tokens includes external tokens)
        return await generate(res, ctx, {
          seq: submit('remote', { hashes, tokens, maxTokens, rec, source }),
          upstreamMs: upstream ? upstream.queueMs + upstream.prefillMs : 0,
          usage: usageOf(tokens, maxTokens, tokens),
          recordLatency: true,
          digests,
          rec,
        });
      }

      if (kind === 'sglang' && role === 'decode') {
        // An SGLang decode-mode server has no local prefill: every request goes through its
        // PreallocQueue with a KV receiver for the request's bootstrap address. Without bootstrap
        // fields that address is "None:None"; _ensure_prefill_info retries it 15 times a second
        // apart, then aborts the receiver and the request fails with 500 "Decode handshake failed"
        // (sgl-project/sglang python/sglang/srt/disaggregation/decode.py DecodePreallocQueue).
        stats.requests.sglangDecode++;
        rec.leg = 'sglangDecode';
        if (ctx.stream) sseHeaders(res);
        await time.clock.sleep(sglangHandshakeTimeoutMs);
        if (ctx.closed) return;
        stats.errors++;
        const message = `Decode handshake failed for request rank=0 decode_req.req.rid='${requestId ?? randomUUID().replace(/-/g, '')}' decode_req.req.bootstrap_room=None with exception Could not fetch prefill parallel info from None:None after 15 attempts`;
        if (!ctx.stream) return sendError(res, 500, message, 'InternalServerError');
        res.end(`data: ${JSON.stringify({ error: { message, type: 'InternalServerError', param: null, code: 500 } })}\n\ndata: [DONE]\n\n`);
        return;
      }
      // Plain OpenAI (colocated), or a vLLM decode node given no kv_transfer_params (or null: P
      // stopped on EOS), which prefills by itself through its own step loop: its prefill chunks
      // share steps with its decodes.
      if (kv === undefined) stats.requests.colocated++;
      else stats.requests.vllmDecode++;
      if (role === 'decode') stats.selfPrefills++;
      rec.leg = kv === undefined ? 'colocated' : 'vllmDecode';
      const seq = submit('local', { hashes, tokens, maxTokens, rec });
      return await generate(res, ctx, {
        seq,
        upstreamMs: 0,
        usage: () => usageOf(tokens, maxTokens, seq.cachedTokens),
        recordLatency: true,
        digests: prompts.map(promptDigest),
        rec,
      });
    } catch (error) {
      stats.errors++;
      if (!res.headersSent) sendError(res, 500, `simulated engine failed: ${error instanceof Error ? error.message : String(error)}`, 'server_error');
      else res.destroy();
    }
  }

  /**
   * The /metrics body as the engine's model has it now; `override` values replace the model's.
   * @param {{ kvUsage?: number, waiting?: number, running?: number }} [values]
   */
  function metricsBody(values = {}) {
    const counts = core.counts();
    return renderMetrics(
      {
        kind: /** @type {'vllm' | 'sglang'} */ (kind),
        vllmMetrics: /** @type {'v1' | 'v0'} */ (vllmMetrics),
        sglangPrefix: /** @type {'sglang:' | 'sglang_'} */ (sglangMetricsPrefix),
      },
      {
        modelName: models[0],
        kvUsage: values.kvUsage ?? memory.usage(),
        waiting: values.waiting ?? counts.waiting,
        running: values.running ?? counts.running,
        blockSize: memory.blockSize,
        numGpuBlocks: memory.numBlocks,
        gpuMemoryUtilization: figures.gpuMemoryUtilization,
        promptTokens: stats.promptTokens,
        generationTokens: stats.outputTokens,
        preemptions: core.stats.preemptions,
        prefixQueries: stats.promptTokens,
        prefixHits: stats.cachedTokens,
      },
    );
  }

  /**
   * GET /metrics, through the test-only metrics fault (sim/cluster.mjs documents it).
   * @param {http.ServerResponse} res
   */
  async function serveMetrics(res) {
    const f = metricsFault;
    const send = (/** @type {string} */ body) => {
      if (res.destroyed) return;
      res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4; charset=utf-8', 'content-length': Buffer.byteLength(body) });
      res.end(body);
    };
    switch (f.mode) {
      case 'status':
        return sendError(res, f.status, `simulated /metrics status ${f.status}`, 'server_error');
      case 'slow':
        await sleepReal(f.delayMs);
        return send(metricsBody());
      case 'garbage':
        res.writeHead(200, { 'content-type': 'text/html' });
        return res.end('<html><body>502 Bad Gateway</body></html>\n{"not": "prometheus"}\nvllm:kv_cache_usage_perc{engine="0" NaNa\n');
      case 'huge': {
        res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4; charset=utf-8' });
        for (const chunk of hugeMetrics(metricsBody(), f.bytes)) {
          if (res.destroyed) return;
          if (!res.write(chunk)) await drained(res);
        }
        return res.end();
      }
      case 'override':
        return send(metricsBody(f.values));
      default:
        return send(metricsBody());
    }
  }

  const server = http.createServer({ keepAlive: true, noDelay: true }, (req, res) => {
    const url = new URL(req.url ?? '/', 'http://sim');
    const path = url.pathname;
    if (req.method === 'POST' && (path === '/v1/chat/completions' || path === '/v1/completions')) {
      handleCompletion(req, res, path).catch((error) => {
        stats.errors++;
        if (!res.headersSent) sendError(res, 500, String(error), 'server_error');
      });
      return;
    }
    // /v1/responses, /v1/embeddings, /tokenize, /detokenize, SGLang's /generate: sim/endpoints.mjs
    if (req.method === 'POST' && ['/v1/responses', '/v1/embeddings', '/tokenize', '/detokenize', '/generate'].includes(path)) {
      const hooks = {
        engine,
        options,
        registry,
        stats: () => stats,
        fault: () => fault,
        inflight: (/** @type {number} */ d) => void (inflight += d),
        record: (/** @type {RequestLogEntry} */ e) => void (log.push(e) > MAX_LOG && log.shift()),
        submit: (/** @type {'local' | 'prefill' | 'remote'} */ k, /** @type {{ hashes: string[], tokens: number, maxTokens: number, source?: string }} */ o) => submit(k, o),
      };
      import('./endpoints.mjs')
        .then((m) => m.handleEndpoint(req, res, path, hooks))
        .catch((error) => {
          stats.errors++;
          if (!res.headersSent) sendError(res, 500, String(error), 'server_error');
        });
      return;
    }
    if (req.method === 'GET' && (path === '/health' || path === '/health_generate')) {
      req.resume();
      if (!fault.health) return sendJson(res, 503, { status: 'unhealthy' });
      if (path === '/health_generate' || healthGenerate) {
        healthGeneration().then(
          () => sendJson(res, 200, { status: 'ok' }),
          () => sendJson(res, 503, { status: 'unhealthy' }),
        );
        return;
      }
      return sendJson(res, 200, { status: 'ok' });
    }
    if (req.method === 'GET' && path === '/metrics') {
      req.resume();
      serveMetrics(res).catch(() => res.destroy());
      return;
    }
    if (req.method === 'GET' && path === '/query') {
      // the Mooncake bootstrap server of a vLLM P (kv_connector/v1/mooncake/mooncake_utils.py
      // MooncakeBootstrapServer.query: {dp_rank: {engine_id, worker_addr: {tp: {pp: addr}}}});
      // the simulator serves it on the engine's bootstrap port, which defaults to its HTTP port
      req.resume();
      return sendJson(res, 200, { 0: { engine_id: mooncakeEngineId, worker_addr: { 0: { 0: `${host}:${engine.port}` } } } });
    }
    if (req.method === 'GET' && path === '/v1/models') {
      req.resume();
      const created = Math.floor(Date.now() / 1000);
      return sendJson(res, 200, { object: 'list', data: models.map((m) => ({ id: m, object: 'model', created, owned_by: 'sim' })) });
    }
    if (req.method === 'GET' && path === '/_sim/stats') {
      req.resume();
      return sendJson(res, 200, engine.stats());
    }
    if (req.method === 'GET' && path === '/_sim/request-stats') {
      req.resume();
      return sendJson(res, 200, engine.requestStats());
    }
    if (req.method === 'GET' && path === '/_sim/requests') {
      req.resume();
      return sendJson(res, 200, log);
    }
    if (req.method === 'POST' && path === '/_sim/reset') {
      req.resume();
      engine.reset();
      return sendJson(res, 200, { ok: true });
    }
    req.resume();
    sendError(res, 404, `no route ${req.method} ${path}`, 'invalid_request_error');
  });
  server.on('connection', (socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
  });

  /** @param {number} port */
  function listen(port) {
    return new Promise((resolve, reject) => {
      const onError = (/** @type {Error} */ error) => reject(error);
      server.once('error', onError);
      server.listen(port, host, () => {
        server.off('error', onError);
        resolve(/** @type {import('node:net').AddressInfo} */ (server.address()).port);
      });
    });
  }

  const boundPort = /** @type {number} */ (await listen(options.port ?? 0));

  /** @type {Engine} */
  const engine = {
    id,
    role,
    host,
    port: boundPort,
    url: `http://${host}:${boundPort}`,
    bootstrapPort: options.bootstrapPort ?? boundPort,
    cache,
    running: true,
    mooncakeEngineId,
    stats: () => {
      const now = time.clock.now();
      const usage = core.usageSummary(now);
      const counts = core.counts();
      return {
        id,
        role,
        kind,
        preset: figures.preset,
        ...structuredClone(stats),
        inflight,
        cacheBlocksUsed: cache.size,
        running: engine.running,
        heldHandles: held.size,
        heldBlocks: [...held.values()].reduce((sum, h) => sum + h.blocks, 0),
        // the engine model: KV memory (blocks of blockSize tokens), queue and batch, step loop
        kvUsage: memory.usage(),
        kvUsagePeak: usage.peak,
        kvUsageMean: usage.mean,
        numGpuBlocks: memory.numBlocks,
        blockSize: memory.blockSize,
        kvEvictions: memory.evictions,
        waitingRequests: counts.waiting,
        runningRequests: counts.running,
        preemptions: core.stats.preemptions,
        steps: core.stats.steps,
        busyMs: core.stats.busyMs,
        ingestStallMs: core.stats.stallMs,
        simNowMs: now,
      };
    },
    setOptions,
    requests: () => [...log],
    requestStats: () => Object.fromEntries(requestStats),
    metrics: metricsBody,
    setMetricsFault(f) {
      metricsFault = { mode: f.mode ?? 'none', values: f.values ?? {}, delayMs: f.delayMs ?? 5000, status: f.status ?? 500, bytes: f.bytes ?? 10_000_000 };
    },
    model: () => ({ figures, memory, core, clock: time.clock, fabric: time.fabric }),
    reset() {
      for (const h of [...held.values()]) h.free('expired');
      held.clear();
      inflightIds.clear();
      core.reset();
      memory.clear();
      stats = emptyStats();
      log = [];
      requestStats = new Map();
      fault = { mode: 'none', count: Infinity, delayMs: 0, afterChunks: 2, health: true, status: 200, headers: {}, body: '', bytes: 0, newline: true };
      metricsFault = { mode: 'none', values: {}, delayMs: 5000, status: 500, bytes: 10_000_000 };
    },
    setFault(f) {
      fault = {
        mode: f.mode ?? 'none',
        count: f.count ?? Infinity,
        delayMs: f.delayMs ?? 1000,
        afterChunks: f.afterChunks ?? 2,
        health: f.health ?? true,
        status: f.status ?? 200,
        headers: f.headers ?? {},
        body: f.body ?? '',
        bytes: f.bytes ?? 16 << 20,
        newline: f.newline ?? true,
      };
    },
    async stop() {
      if (!engine.running) return;
      engine.running = false;
      const closed = new Promise((resolve) => server.close(() => resolve(undefined)));
      for (const socket of sockets) socket.destroy();
      await closed;
    },
    async start() {
      if (engine.running) return;
      await listen(engine.port);
      engine.running = true;
      // a restarted vLLM gets a new engine id (uuid4 unless configured: vllm/config/kv_transfer.py)
      if (options.mooncakeEngineId === undefined) engine.mooncakeEngineId = mooncakeEngineId = `vllm-${randomUUID()}`;
    },
    async close() {
      await engine.stop();
      core.close();
      if (registry.engines.get(id) === engine) registry.engines.delete(id);
    },
  };
  registry.engines.set(id, engine);
  return engine;
}

/** @param {Registry} registry @param {string} room @param {RoomEntry} entry */
function publishRoom(registry, room, entry) {
  publish(registry.rooms, registry.roomWaiters, room, entry, MAX_REMEMBERED);
}

/** @param {Registry} registry @param {string} key @param {TransferEntry} entry */
function publishTransfer(registry, key, entry) {
  publish(registry.transfers, registry.transferWaiters, key, entry, MAX_REMEMBERED);
}

/**
 * Wait for a Mooncake prefill (D's worker polls P for the transfer_id), the timeout or the client leaving.
 * @param {Registry} registry @param {string} key @param {number} timeoutMs @param {{ closed: boolean }} ctx
 * @returns {Promise<TransferEntry | undefined>}
 */
function waitTransfer(registry, key, timeoutMs, ctx) {
  return waitFor(registry.transfers, registry.transferWaiters, key, timeoutMs, ctx);
}

/**
 * Wait until the prefill of a room is published, the timeout passes or the client leaves.
 * @param {Registry} registry @param {string} room @param {number} timeoutMs @param {{ closed: boolean }} ctx
 * @returns {Promise<RoomEntry | undefined>}
 */
function waitRoom(registry, room, timeoutMs, ctx) {
  return waitFor(registry.rooms, registry.roomWaiters, room, timeoutMs, ctx);
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

/**
 * An SSE answer whose first line (a usage event padded out) is `bytes` long, written at the pace
 * the reader takes it; then `[DONE]` when `newline`, else the stream ends mid-line.
 * @param {http.ServerResponse} res @param {number} bytes @param {boolean} newline
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

/** Resolves when a response can take more, or closed. @param {http.ServerResponse} res */
function drained(res) {
  return new Promise((resolve) => {
    const done = () => {
      res.off('drain', done);
      res.off('close', done);
      resolve(undefined);
    };
    res.on('drain', done);
    res.on('close', done);
  });
}

/** Send SSE response headers unless they went out already. @param {http.ServerResponse} res */
function sseHeaders(res) {
  if (res.headersSent) return;
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', connection: 'keep-alive' });
  res.flushHeaders();
}

/**
 * The first word of every answer the simulator generates for a prompt: `p` + 8 hex digits of its
 * SHA-256. A decode leg that read another prompt's KV starts with that prompt's digest instead.
 * @param {string | number[]} prompt
 */
export function promptDigest(prompt) {
  return (
    'p' +
    createHash('sha256')
      .update(typeof prompt === 'string' ? prompt : JSON.stringify(prompt))
      .digest('hex')
      .slice(0, 8)
  );
}

/**
 * What a correct answer to this body starts with (each choice's text, or a chat message's
 * content): `expectedPrefix(body).startsWith`-style checks tell an answer that belongs to this
 * prompt from one computed on another prompt's KV. For a batched /v1/completions, the digest of
 * prompt `index`.
 * @param {any} body request body (chat when it has `messages`) @param {number} [index]
 */
export function expectedPrefix(body, index = 0) {
  const prompts = promptsOf(body, Array.isArray(body?.messages));
  if (!prompts[index]) throw new TypeError('body has no prompt');
  return promptDigest(prompts[index]);
}

/**
 * Every prompt of a body: one for chat or a single prompt, N for a batched /v1/completions
 * (a list of strings or a list of token-id lists).
 * @param {any} body @param {boolean} chat @returns {(string | number[])[]}
 */
export function promptsOf(body, chat) {
  const p = body?.prompt;
  if (!chat && Array.isArray(p) && p.length > 1 && (typeof p[0] === 'string' || Array.isArray(p[0]))) return p;
  const one = promptOf(body, chat);
  return one === undefined ? [] : [one];
}

/**
 * The prompt as text (chat messages rendered `role: content`, one a line) or token ids.
 * @param {any} body @param {boolean} chat
 * @returns {string | number[] | undefined}
 */
export function promptOf(body, chat) {
  if (chat) {
    if (!Array.isArray(body.messages) || body.messages.length === 0) return undefined;
    return body.messages
      .map((/** @type {any} */ m) => {
        const content = Array.isArray(m?.content)
          ? m.content.map((/** @type {any} */ part) => (part && part.type === 'text' ? String(part.text ?? '') : '')).join('')
          : typeof m?.content === 'string'
            ? m.content
            : '';
        return `${m?.role ?? 'user'}: ${content}`;
      })
      .join('\n');
  }
  const p = body.prompt;
  if (typeof p === 'string') return p;
  if (Array.isArray(p) && p.length > 0) {
    if (p.every((x) => typeof x === 'number')) return p;
    if (typeof p[0] === 'string') return p[0];
    if (Array.isArray(p[0]) && p[0].every((/** @type {unknown} */ x) => typeof x === 'number')) return p[0];
  }
  return undefined;
}
