// The simulated engine's types, shared by its modules (sim/engine.mjs re-exports the public
// ones): its options, faults, the registry the engines of a cluster share, and the Engine handle.

/**
 * @typedef {import('./stats.mjs').LegKind} LegKind
 * @typedef {import('./stats.mjs').RequestStats} RequestStats
 * @typedef {import('../model/clock.mjs').SimClock} SimClock
 * @typedef {import('../model/fabric.mjs').Fabric} Fabric
 * @typedef {import('../model/kv-memory.mjs').KvMemory} KvMemory
 * @typedef {import('../model/scheduler.mjs').EngineCore} EngineCore
 */

/**
 * @typedef {'prefill' | 'decode' | 'both'} EngineRole
 * @typedef {'none' | 'status500' | 'status400' | 'hang' | 'reset' | 'midstream' | 'slow' | 'silent' | 'eos' | 'respond' | 'stall' | 'flood' | 'bigint'} FaultMode
 * `respond`: answer `status` with `headers` and `body`, whatever was asked (a misconfigured or
 * hostile node: 401, 3xx, 204, garbage); `stall`: stop sending after `afterChunks` events (half
 * the body when not streamed) and keep the connection open; `flood`: an SSE answer whose first
 * line is `bytes` long, ended by a newline only when `newline`; `bigint`: a vLLM P whose
 * kv_transfer_params carries `remote_big_id` 12345678901234567890 (beyond 2^53).
 * @typedef {{ mode?: FaultMode, count?: number, delayMs?: number, afterChunks?: number, health?: boolean, status?: number, headers?: Record<string, string>, body?: string, bytes?: number, newline?: boolean }} Fault
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
 * @property {number} [streamInterval] tokens a stream event carries after the first (vLLM and SGLang
 *   `--stream-interval`; Dynamo's vLLM frontend sends 20), default 1
 * @property {boolean} [forceIncludeUsage] a stream's usage frame even when the client did not ask
 *   (vLLM and SGLang `--enable-force-include-usage`), default false
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
 * @property {Map<string, { queueMs: number, prefillMs: number, computedTokens?: number }>} prefills
 * @property {Map<string, true>} claimedRooms `engineId/room` taken as a prefill leg by a `both` engine
 * @property {Map<string, HeldKv>} handles vLLM KV handles by `remote_engine_id/remote_request_id` (and Mooncake transfers by `mc/engine/transfer_id`)
 * @property {Map<string, TransferEntry>} transfers Mooncake prefills by `engineId/transfer_id`
 * @property {Map<string, Set<(entry: TransferEntry) => void>>} transferWaiters
 * @property {Map<number, { clock: SimClock, fabric: Fabric, holds: import('../model/router-holds.mjs').RouterHolds }>} clocks the cluster's simulated clock and
 *   its network, one per time scale (a cluster normally has one; the test suite mixes two)
 *
 * @typedef {{ key: string, engineId: string, digest: string, blocks: number, state: 'held' | 'read' | 'released' | 'expired', free: (how: 'read' | 'released' | 'expired') => void }} HeldKv
 * @typedef {{ engineId: string, mooncakeEngineId: string, hashes: string[], digest: string, queueMs: number, prefillMs: number, computedTokens?: number }} TransferEntry
 *
 * @typedef {{ engineId: string, host: string, bootstrapPort: number, port: number, hashes: string[], queueMs: number, prefillMs: number, digest?: string, aborted?: boolean, computedTokens?: number }} RoomEntry
 */

/**
 * @typedef {Pick<EngineOptions, 'timeScale' | 'prefillMsPerToken' | 'transferMsPerBlock' | 'decodeBaseMs' | 'decodeMsPerSeq' | 'ingestMsPerBlock' | 'kvHoldTimeoutMs' | 'rejectionReleasesHandle' | 'promptTokensDetails' | 'sglangAbortGraceMs' | 'sglangStreamAbortGraceMs' | 'healthGenerate' | 'rejectDuplicateRequestIds' | 'streamInterval' | 'forceIncludeUsage' | 'kind' | 'vllmMetrics' | 'sglangMetricsPrefix' | 'maxNumSeqs' | 'maxNumBatchedTokens' | 'preemption' | 'sglangHandshakeTimeoutMs'>} TunableOptions
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
 * @property {() => ReturnType<typeof import('./stats.mjs').emptyStats> & { id: string, role: EngineRole, inflight: number, cacheBlocksUsed: number, running: boolean }} stats
 * @property {() => RequestLogEntry[]} requests
 * @property {() => Record<string, RequestStats>} requestStats figures per x-request-id
 * @property {() => void} reset
 * @property {(values?: { kvUsage?: number, waiting?: number, running?: number }) => string} metrics the /metrics body now
 * @property {(f: { mode?: 'none' | 'override' | 'slow' | 'huge' | 'garbage' | 'status', values?: { kvUsage?: number, waiting?: number, running?: number }, delayMs?: number, status?: number, bytes?: number }) => void} setMetricsFault
 * @property {() => { figures: ReturnType<typeof import('../presets.mjs').resolveModel>, memory: KvMemory, core: EngineCore, clock: SimClock, fabric: Fabric }} model
 * @property {(f: Fault) => void} setFault
 * @property {(o: Partial<TunableOptions>) => void} setOptions change tunable options at run time (kept across reset)
 * @property {string} mooncakeEngineId
 * @property {() => Promise<void>} stop
 * @property {() => Promise<void>} start
 * @property {() => Promise<void>} close
 */

/**
 * One completion request as its handler and answer see it.
 * @typedef {{ chat: boolean, stream: boolean, model: string, includeUsage: boolean, samples?: number, destroyAfterChunks?: number, stallAfterChunks?: number, bigKvInt?: boolean, destroyedByUs: boolean, closed: boolean, omitKvTransferParams?: boolean, onClose?: () => void, promptText?: string }} Ctx
 */

/**
 * A completion request as its leg sees it, read and validated once (sim/engine/completions.mjs).
 * @typedef {object} Call
 * @property {import('node:http').ServerResponse} res
 * @property {Ctx} ctx
 * @property {any} body the parsed request body
 * @property {RequestLogEntry} entry its request-log entry (the exact bootstrap room)
 * @property {(string | number[])[]} prompts every prompt of the body (a batch: more than one)
 * @property {string} digest the first prompt's digest (sim/engine/prompt.mjs)
 * @property {string[]} hashes the first prompt's prefix units
 * @property {number} tokens the first prompt's tokens
 * @property {number} maxTokens
 * @property {any} kv kv_transfer_params
 * @property {string | undefined} requestId x-request-id
 * @property {Partial<RequestStats>} rec this request's figures (request-stats)
 */

export {};
