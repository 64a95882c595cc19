// What one simulated engine counts: its totals (requests by leg, prefix hits, handles, faults,
// protocol violations, latency samples) and the figures it keeps per request (x-request-id).

/**
 * @typedef {'vllmPrefill' | 'vllmDecode' | 'sglangPrefill' | 'sglangDecode' | 'colocated'} LegKind
 */

/** The engine's totals as they start (and after a reset). */
export function emptyStats() {
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
 * Count a protocol violation and keep its explanation (the last 50).
 * @param {ReturnType<typeof emptyStats>} stats @param {string} why
 */
export function noteViolation(stats, why) {
  stats.protocolViolations++;
  stats.violations.push(why);
  if (stats.violations.length > 50) stats.violations.shift();
}
