// One simulated engine's state, which its modules share (sim/engine.mjs creates it and wires
// them): its identity and options, the engine model (figures of a preset, KV memory, step loop, on
// the cluster's clock and links), its counters, request log and injected faults. What a tunable
// option changes at run time is re-derived here (setOptions).
import { randomUUID } from 'node:crypto';
import { KvMemory } from '../model/kv-memory.mjs';
import { EngineCore } from '../model/scheduler.mjs';
import { resolveModel } from '../presets.mjs';
import { clusterTime, createRegistry } from './registry.mjs';
import { emptyStats, noteViolation } from './stats.mjs';

/**
 * @typedef {import('./types.mjs').EngineOptions} EngineOptions
 * @typedef {import('./types.mjs').TunableOptions} TunableOptions
 * @typedef {import('./types.mjs').Fault} Fault
 * @typedef {import('./types.mjs').HeldKv} HeldKv
 * @typedef {import('./types.mjs').RequestLogEntry} RequestLogEntry
 * @typedef {import('./stats.mjs').RequestStats} RequestStats
 * @typedef {{ mode: 'none' | 'override' | 'slow' | 'huge' | 'garbage' | 'status', values: { kvUsage?: number, waiting?: number, running?: number }, delayMs: number, status: number, bytes: number }} MetricsFault
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
  'streamInterval',
  'forceIncludeUsage',
];
/** tunable options that take one of a few strings */
export const STRING_OPTIONS = /** @type {Record<string, string[]>} */ ({
  kind: ['vllm', 'sglang'],
  vllmMetrics: ['v1', 'v0'],
  sglangMetricsPrefix: ['sglang:', 'sglang_'],
});

/** the options a preset's figures come from, kept so a tunable change re-derives the rest */
const MODEL_OPTIONS = [
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
];

/** @returns {Required<Fault>} */
export const noFault = () => ({ mode: 'none', count: Infinity, delayMs: 0, afterChunks: 2, health: true, status: 200, headers: {}, body: '', bytes: 0, newline: true });
/** @returns {MetricsFault} */
export const noMetricsFault = () => ({ mode: 'none', values: {}, delayMs: 5000, status: 500, bytes: 10_000_000 });

/**
 * An engine's state from its options (defaults filled in); `engine` is set once it listens.
 * @param {EngineOptions} options
 */
export function createState(options) {
  const {
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
    streamInterval = 1,
    forceIncludeUsage = false,
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
  for (const k of MODEL_OPTIONS) {
    if (/** @type {any} */ (options)[k] !== undefined) modelOverrides[k] = /** @type {any} */ (options)[k];
  }
  const figures = resolveModel({ ...modelOverrides, blockTokens });
  const memory = new KvMemory({ numBlocks: figures.numGpuBlocks, blockSize: figures.blockSize, unitTokens: blockTokens });
  const state = {
    options,
    id,
    role,
    host,
    models,
    blockTokens,
    charsPerToken,
    bootstrapTimeoutMs,
    sampleCap,
    registry,
    // tunable at run time (setOptions)
    timeScale,
    kvHoldTimeoutMs,
    rejectionReleasesHandle,
    promptTokensDetails,
    sglangAbortGraceMs,
    sglangStreamAbortGraceMs,
    healthGenerate,
    rejectDuplicateRequestIds,
    streamInterval,
    forceIncludeUsage,
    kind,
    vllmMetrics,
    sglangMetricsPrefix,
    sglangHandshakeTimeoutMs,
    /** a restarted vLLM gets a new one */
    mooncakeEngineId,
    // the engine model
    modelOverrides,
    figures,
    time: clusterTime(registry, timeScale),
    memory,
    /** @type {EngineCore} */
    core: /** @type {any} */ (undefined),
    cache: cacheOf(memory),
    /** KV blocks this P holds for handles no D has read yet, by handle key */
    /** @type {Map<string, HeldKv>} */
    held: new Map(),
    /** x-request-ids of the requests in flight here */
    /** @type {Set<string>} */
    inflightIds: new Set(),
    internalCounter: 0,
    stats: emptyStats(),
    /** @type {RequestLogEntry[]} */
    log: [],
    /** @type {Map<string, RequestStats>} */
    requestStats: new Map(),
    fault: noFault(),
    inflight: 0,
    completionCounter: 0,
    metricsFault: noMetricsFault(),
    /** @type {Set<import('node:net').Socket>} */
    sockets: new Set(),
    /** @type {import('./types.mjs').Engine} the engine's handle, once it listens */
    engine: /** @type {any} */ (undefined),
  };
  state.core = new EngineCore({
    clock: state.time.clock,
    memory,
    cost: figures.cost,
    maxNumBatchedTokens: figures.maxNumBatchedTokens,
    maxNumSeqs: figures.maxNumSeqs,
    preemption: figures.preemption,
    stallLoadBytesPerMs: figures.stallLoadBytesPerMs,
    moved: (at) => state.time.fabric.stalling(id, at),
  });
  registerLink(state);
  return state;
}

/** @typedef {ReturnType<typeof createState>} EngineState */

/** This engine's link on the cluster's fabric, with its figures. @param {EngineState} state */
function registerLink(state) {
  state.time.fabric.configure(state.figures.fabric);
  state.time.fabric.register(state.id, { linkBytesPerMs: state.figures.linkBytesPerMs, group: state.options.group });
}

/** @param {EngineState} state @param {Partial<TunableOptions>} o */
/**
 * @param {EngineState} state
 * @param {Partial<TunableOptions>} o
 */
export function setOptions(state, o) {
  const { registry, core, modelOverrides, blockTokens } = state;
  if (o.timeScale !== undefined && o.timeScale !== state.timeScale) {
    state.timeScale = o.timeScale;
    state.time = clusterTime(registry, state.timeScale);
    core.configure({ clock: state.time.clock });
    registerLink(state);
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
    state.figures = resolveModel({ ...modelOverrides, blockTokens });
    core.configure({
      cost: state.figures.cost,
      maxNumBatchedTokens: state.figures.maxNumBatchedTokens,
      maxNumSeqs: state.figures.maxNumSeqs,
      preemption: state.figures.preemption,
      stallLoadBytesPerMs: state.figures.stallLoadBytesPerMs,
    });
    registerLink(state);
  }
  if (o.kvHoldTimeoutMs !== undefined) state.kvHoldTimeoutMs = o.kvHoldTimeoutMs;
  if (o.rejectionReleasesHandle !== undefined) state.rejectionReleasesHandle = o.rejectionReleasesHandle;
  if (o.promptTokensDetails !== undefined) state.promptTokensDetails = o.promptTokensDetails;
  if (o.sglangAbortGraceMs !== undefined) state.sglangAbortGraceMs = o.sglangAbortGraceMs;
  if (o.sglangStreamAbortGraceMs !== undefined) state.sglangStreamAbortGraceMs = o.sglangStreamAbortGraceMs;
  if (o.healthGenerate !== undefined) state.healthGenerate = o.healthGenerate;
  if (o.rejectDuplicateRequestIds !== undefined) state.rejectDuplicateRequestIds = o.rejectDuplicateRequestIds;
  if (o.streamInterval !== undefined) state.streamInterval = o.streamInterval;
  if (o.forceIncludeUsage !== undefined) state.forceIncludeUsage = o.forceIncludeUsage;
  if (o.sglangHandshakeTimeoutMs !== undefined) state.sglangHandshakeTimeoutMs = o.sglangHandshakeTimeoutMs;
  if (o.kind !== undefined) state.kind = o.kind;
  if (o.vllmMetrics !== undefined) state.vllmMetrics = o.vllmMetrics;
  if (o.sglangMetricsPrefix !== undefined) state.sglangMetricsPrefix = o.sglangMetricsPrefix;
}

/**
 * The prefix cache as the rest of the simulator reads it: the cached units of the KV memory.
 * @param {KvMemory} memory
 */
function cacheOf(memory) {
  return {
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
}

/** @param {EngineState} state @param {number[]} arr @param {number} value */
export function sample(state, arr, value) {
  if (arr.length < state.sampleCap) arr.push(value);
}

/** @param {EngineState} state @param {string} why */
export function violation(state, why) {
  noteViolation(state.stats, why);
}

/**
 * What GET /_sim/stats answers: the engine's counters and its model's figures now.
 * @param {EngineState} state
 */
export function statsOf(state) {
  const { id, role, cache, held, memory, core, engine } = state;
  const now = state.time.clock.now();
  const usage = core.usageSummary(now);
  const counts = core.counts();
  return {
    id,
    role,
    kind: state.kind,
    preset: state.figures.preset,
    ...structuredClone(state.stats),
    inflight: state.inflight,
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
}

/** Forget every request, figure and fault (the engine's reset; its options stay). @param {EngineState} state */
export function resetState(state) {
  const { held, inflightIds, core, memory } = state;
  for (const h of [...held.values()]) h.free('expired');
  held.clear();
  inflightIds.clear();
  core.reset();
  memory.clear();
  state.stats = emptyStats();
  state.log = [];
  state.requestStats = new Map();
  state.fault = noFault();
  state.metricsFault = noMetricsFault();
}
