// Engine presets: the hardware, the model and the serving settings of a simulated engine, every
// figure with its unit and where it comes from. A preset yields the coefficients the model
// modules use (sim/model/*). docs/simulator.md lists them with their sources and says which were
// calibrated, on what.
import { DEFAULT_FABRIC } from './model/fabric.mjs';

const GiB = 2 ** 30;

/**
 * @typedef {object} Hardware
 * @property {string} name
 * @property {number} hbmBytes memory of one GPU (vendor "GB" figures are GiB as the driver reports them)
 * @property {number} hbmBytesPerS HBM bandwidth, bytes/s
 * @property {number} peakFlops dense BF16 tensor FLOP/s (without structured sparsity)
 * @property {number} linkBytesPerS network bytes/s one GPU's KV transfers share, each direction
 * @property {string} source
 *
 * @typedef {object} Model
 * @property {string} name
 * @property {number} layers
 * @property {number} qHeads
 * @property {number} kvHeads
 * @property {number} headDim
 * @property {number} totalParams
 * @property {number} activeParams parameters a token runs through (all of a dense model)
 * @property {number} embeddingParams input embedding and LM head (vocab x hidden, twice when untied):
 *   a lookup and one logits row a sequence, not per-token matmuls of a prefill, so left out of its FLOPs
 * @property {number} expertParams parameters in MoE experts (0: dense)
 * @property {number} experts experts a MoE layer has
 * @property {number} expertsPerToken
 * @property {number} weightBytesPerParam 2 for BF16
 * @property {number} kvBytesPerElement 2 for a BF16 KV cache
 * @property {string} source
 *
 * @typedef {object} Preset
 * @property {string} hardware key of HARDWARE
 * @property {string} model key of MODELS
 * @property {number} mfu achieved share of peak FLOPs in compute-bound steps
 * @property {number} mbu achieved share of HBM bandwidth in memory-bound steps
 * @property {number} stepOverheadMs fixed cost of a step
 * @property {number} perSeqMs cost a sequence in a step
 * @property {number} gpuMemoryUtilization vLLM --gpu-memory-utilization
 * @property {number} nonKvReserveBytes activations, CUDA graphs and the rest vLLM's profiling keeps out of the KV cache
 * @property {number} blockSize vLLM block_size, tokens
 * @property {number} maxNumBatchedTokens
 * @property {number} maxNumSeqs
 * @property {boolean} preemption
 * @property {number} stallLoadShare the effective load rate of a step loop that stalls while held KV
 *   moves in or out of the engine (a prefix fetched from the mesh, the cached context a decode node
 *   re-pulls from P; not the KV a prefill just computed for the request, which streams), as a share
 *   of HBM bandwidth: a step lengthens by stalling bytes moved / (share x bandwidth) (fitted, seed 000)
 * @property {boolean} prefixMesh a P fetches the prefix another engine holds instead of computing it
 *   (seed 000's content-addressed KV mesh; vLLM's P does not)
 * @property {import('./model/fabric.mjs').FabricSettings} fabric
 * @property {string} notes
 */

/** @type {Record<string, Hardware>} */
export const HARDWARE = {
  // A made-up GPU with round figures, for the test suite: prefill 0.05 ms a token, a decode step of
  // 15 ms + 1 ms a sequence, a KV transfer of 5 ms a 512-token block (the simulator's old constants).
  'sim-gpu': {
    name: 'simulated GPU (test figures)',
    hbmBytes: 400 * GiB,
    hbmBytesPerS: 1e12,
    peakFlops: 3e14,
    linkBytesPerS: (512 * 131072) / 0.005,
    source: 'round figures chosen for the tests (not a real GPU)',
  },
  // NVIDIA H200 SXM datasheet (nvidia.com/en-us/data-center/h200): 141 GB HBM3e, 4.8 TB/s,
  // BF16 Tensor Core 1,979 TFLOPS "with sparsity" = 989 dense. Seed 000: 400 Gb/s InfiniBand per GPU.
  h200: {
    name: 'NVIDIA H200 SXM',
    hbmBytes: 141 * GiB,
    hbmBytesPerS: 4.8e12,
    peakFlops: 989e12,
    linkBytesPerS: 400e9 / 8,
    source: 'NVIDIA H200 datasheet; seed 000 (400G IB per GPU)',
  },
  // NVIDIA H20 (no public datasheet; the figures every listing gives, e.g. willitrunai.com/gpus/h20-96gb):
  // 96 GB HBM3, 4.0 TB/s, 148 TFLOPS BF16 dense. Seed 002: 8 GPUs with 4 x 200 Gb/s NICs, so a
  // GPU's share is 800 Gb/s / 8.
  h20: {
    name: 'NVIDIA H20 96 GB',
    hbmBytes: 96 * GiB,
    hbmBytesPerS: 4.0e12,
    peakFlops: 148e12,
    linkBytesPerS: (4 * 200e9) / 8 / 8,
    source: 'H20 listings (96 GB HBM3, 4.0 TB/s, 148 TFLOPS BF16); seed 002 (4 x 200 Gb/s for 8 GPUs)',
  },
};

/** @type {Record<string, Model>} */
export const MODELS = {
  // An 8B-class dense model with round numbers (the tests' "sim-model").
  'sim-model': {
    name: 'sim-model',
    layers: 32,
    qHeads: 32,
    kvHeads: 8,
    headDim: 128,
    totalParams: 7.5e9,
    activeParams: 7.5e9,
    embeddingParams: 0,
    expertParams: 0,
    experts: 0,
    expertsPerToken: 0,
    weightBytesPerParam: 2,
    kvBytesPerElement: 2,
    source: 'round figures chosen for the tests',
  },
  // Qwen/Qwen3-14B config.json: num_hidden_layers 40, num_attention_heads 40,
  // num_key_value_heads 8, head_dim 128, hidden_size 5120, vocab_size 151936, tie_word_embeddings
  // false (embeddings 2 x 151936 x 5120 = 1.56 B); model card: 14.8 B parameters. BF16 KV:
  // 2 x 40 x 8 x 128 x 2 B = 160 KiB a token.
  'qwen3-14b': {
    name: 'Qwen/Qwen3-14B',
    layers: 40,
    qHeads: 40,
    kvHeads: 8,
    headDim: 128,
    totalParams: 14.8e9,
    activeParams: 14.8e9,
    embeddingParams: 2 * 151936 * 5120,
    expertParams: 0,
    experts: 0,
    expertsPerToken: 0,
    weightBytesPerParam: 2,
    kvBytesPerElement: 2,
    source: 'huggingface.co/Qwen/Qwen3-14B (config.json, model card)',
  },
  // Qwen/Qwen3-Coder-30B-A3B-Instruct config.json: num_hidden_layers 48, num_attention_heads 32,
  // num_key_value_heads 4, head_dim 128, hidden_size 2048, moe_intermediate_size 768, num_experts
  // 128, num_experts_per_tok 8, vocab_size 151936, tie_word_embeddings false (embeddings
  // 2 x 151936 x 2048 = 0.62 B); model card: 30.5 B total, 3.3 B activated. Experts hold
  // 3 x 2048 x 768 x 128 x 48 = 29.0 B parameters. BF16 KV: 2 x 48 x 4 x 128 x 2 B = 96 KiB a token.
  'qwen3-coder-30b-a3b': {
    name: 'Qwen/Qwen3-Coder-30B-A3B-Instruct',
    layers: 48,
    qHeads: 32,
    kvHeads: 4,
    headDim: 128,
    totalParams: 30.5e9,
    activeParams: 3.3e9,
    embeddingParams: 2 * 151936 * 2048,
    expertParams: 3 * 2048 * 768 * 128 * 48,
    experts: 128,
    expertsPerToken: 8,
    weightBytesPerParam: 2,
    kvBytesPerElement: 2,
    source: 'huggingface.co/Qwen/Qwen3-Coder-30B-A3B-Instruct (config.json, model card)',
  },
};

// vLLM serving defaults: block_size 16 (vllm/config/cache.py DEFAULT_BLOCK_SIZE);
// gpu_memory_utilization 0.9 (0.92 on current main); for the OpenAI server on GPUs with >= 70 GiB
// that are not A100: max_num_batched_tokens 8192 and max_num_seqs 1024
// (vllm/engine/arg_utils.py get_batch_defaults); preemption by recompute (v1 scheduler).
const VLLM_DEFAULTS = { blockSize: 16, gpuMemoryUtilization: 0.9, maxNumBatchedTokens: 8192, maxNumSeqs: 1024, preemption: true };

// The fitted parameters, at most two a seed, each on one named published figure (docs/simulator.md).
/** seed 000: achieved share of HBM bandwidth in decode; fit: P+D affinity TPOT p99 22.8 ms */
export const SEED000_MBU = 0.49;
/** seed 000: effective load rate of a step loop stalled by held KV moving, share of HBM bandwidth; fit: P affinity ITL p99 49.2 ms */
export const SEED000_STALL_LOAD_SHARE = 0.004;
/** seed 002: achieved share of peak FLOPs in prefill; fit: colocated cache-aware TTFT p50 0.731 s */
export const SEED002_MFU = 0.82;
/** seed 002: fixed cost of an eager-mode step, ms; fit: PD 4P+4D TPOT p90 74 ms */
export const SEED002_STEP_OVERHEAD_MS = 58.5;

/** @type {Record<string, Preset>} */
export const PRESETS = {
  default: {
    hardware: 'sim-gpu',
    model: 'sim-model',
    mfu: 1,
    mbu: 1,
    stepOverheadMs: 0,
    perSeqMs: 1,
    ...VLLM_DEFAULTS,
    nonKvReserveBytes: 0,
    // landing one 512-token block costs 5 ms of step time, as long as its transfer takes
    stallLoadShare: (512 * 131072) / 0.005 / 1e12,
    prefixMesh: false,
    fabric: { ...DEFAULT_FABRIC },
    notes: 'test fixture: round figures, memory sized by cacheBlocks',
  },
  seed000: {
    hardware: 'h200',
    model: 'qwen3-14b',
    // assumed: a large-GEMM prefill on Hopper reaches about half the dense peak
    mfu: 0.5,
    // FITTED on P+D affinity's TPOT p99 (22.8 ms, seed 000): its turns move only fresh KV, which
    // stalls nothing, so this fit does not see the stall's; see docs/simulator.md
    mbu: SEED000_MBU,
    stepOverheadMs: 2,
    perSeqMs: 0,
    ...VLLM_DEFAULTS,
    nonKvReserveBytes: 4 * GiB,
    // FITTED on P affinity's ITL p99 (49.2 ms, seed 000); see docs/simulator.md
    stallLoadShare: SEED000_STALL_LOAD_SHARE,
    // seed 000's engines (OpenInfer) share a content-addressed KV mesh: P fetches held prefixes
    prefixMesh: true,
    // assumed: a transfer's handshake and completion notification
    fabric: { setupMs: 1, crossGroupShare: 0.5, crossGroupLatencyMs: 2 },
    notes: 'seed 000: 2P+2D, H200, 400G IB per GPU, Qwen3-14B bf16, OpenInfer engines with a KV mesh',
  },
  seed002: {
    hardware: 'h20',
    model: 'qwen3-coder-30b-a3b',
    // FITTED on colocated cache-aware TTFT p50 (0.731 s, seed 002): the prefill rate as a share of
    // the dense peak. 0.82 is high for a MoE's prefill (its experts' GEMMs are small), but below the
    // H20's peak; with the agentic trace's earlier, narrower cold prompts it had to be 1.3, above it
    // (docs/simulator.md)
    mfu: SEED002_MFU,
    // seed 000's fit (memory-bound reads are the hardware's, not the software's)
    mbu: SEED000_MBU,
    // FITTED on PD 4P+4D TPOT p90 (74 ms, seed 002): vLLM 0.18.1 --enforce-eager launches every
    // kernel of every layer each step (no CUDA graphs), which dominates a small MoE's decode step
    stepOverheadMs: SEED002_STEP_OVERHEAD_MS,
    perSeqMs: 0,
    ...VLLM_DEFAULTS,
    nonKvReserveBytes: 4 * GiB,
    // seed 000's fit, as a share of this GPU's HBM bandwidth (predicted, not fitted here)
    stallLoadShare: SEED000_STALL_LOAD_SHARE,
    // vLLM + Mooncake: a P computes what it does not hold itself
    prefixMesh: false,
    fabric: { setupMs: 1, crossGroupShare: 0.5, crossGroupLatencyMs: 2 },
    notes: 'seed 002: 8 x H20 96 GB, 4 x 200 Gb/s, vLLM 0.18.1 --enforce-eager + Mooncake, Qwen3-Coder-30B-A3B',
  },
};

/**
 * Engine options that override a preset's figures (all optional). The legacy names (in ms) keep
 * older test fixtures meaningful: each sets the coefficient that gives that cost.
 * @typedef {object} ModelOverrides
 * @property {string} [preset] default | seed000 | seed002
 * @property {number} [cacheBlocks] KV capacity in 512-token prefix units (the old prefix-cache size)
 * @property {number} [numGpuBlocks] KV capacity in blocks
 * @property {number} [blockSize]
 * @property {number} [blockTokens] prefix-cache unit in tokens (512)
 * @property {number} [maxNumBatchedTokens]
 * @property {number} [maxNumSeqs]
 * @property {boolean} [preemption]
 * @property {number} [mfu]
 * @property {number} [mbu]
 * @property {number} [stepOverheadMs]
 * @property {number} [prefillMsPerToken] linear prefill cost a token (sets the achieved FLOP rate)
 * @property {number} [decodeBaseMs] a decode step's weight read (sets the achieved HBM rate)
 * @property {number} [decodeMsPerSeq] cost a sequence in a step
 * @property {number} [transferMsPerBlock] KV transfer ms a 512-token block at full link rate (0: instant)
 * @property {number} [ingestMsPerBlock] step time a landed 512-token block costs the receiver (0: none)
 * @property {number} [transferInterferenceMs] legacy: 0 turns the receiving cost off
 * @property {number} [linkGbps] NIC Gb/s a direction
 * @property {number} [stallLoadShare]
 * @property {number} [ingestHbmShare] legacy name of stallLoadShare
 * @property {boolean} [prefixMesh]
 */

/**
 * What an engine's model modules need, from its preset and overrides.
 * @param {ModelOverrides} o
 */
export function resolveModel(o = {}) {
  const presetName = o.preset ?? 'default';
  const preset = PRESETS[presetName];
  if (!preset) throw new RangeError(`unknown preset ${presetName}; one of ${Object.keys(PRESETS).join(', ')}`);
  const hw = HARDWARE[preset.hardware];
  const m = MODELS[preset.model];
  const unitTokens = o.blockTokens ?? 512;
  const blockSize = o.blockSize ?? preset.blockSize;
  const kvBytesPerToken = 2 * m.layers * m.kvHeads * m.headDim * m.kvBytesPerElement;
  const expertWeightBytes = m.expertParams * m.weightBytesPerParam;
  const denseWeightBytes = (m.totalParams - m.expertParams) * m.weightBytesPerParam;
  const linearFlopsPerToken = 2 * (m.activeParams - m.embeddingParams);
  let flopsPerMs = (hw.peakFlops * (o.mfu ?? preset.mfu)) / 1000;
  let bytesPerMs = (hw.hbmBytesPerS * (o.mbu ?? preset.mbu)) / 1000;
  if (o.prefillMsPerToken !== undefined) flopsPerMs = o.prefillMsPerToken > 0 ? linearFlopsPerToken / o.prefillMsPerToken : Infinity;
  if (o.decodeBaseMs !== undefined) bytesPerMs = o.decodeBaseMs > 0 ? (denseWeightBytes + expertWeightBytes) / o.decodeBaseMs : Infinity;
  const blockBytes = unitTokens * kvBytesPerToken;
  let linkBytesPerMs = hw.linkBytesPerS / 1000;
  if (o.linkGbps !== undefined) linkBytesPerMs = o.linkGbps > 0 ? (o.linkGbps * 1e9) / 8 / 1000 : Infinity;
  if (o.transferMsPerBlock !== undefined) linkBytesPerMs = o.transferMsPerBlock > 0 ? blockBytes / o.transferMsPerBlock : Infinity;
  let stallLoadBytesPerMs = ((o.stallLoadShare ?? o.ingestHbmShare ?? preset.stallLoadShare) * hw.hbmBytesPerS) / 1000;
  if (o.ingestMsPerBlock !== undefined) stallLoadBytesPerMs = o.ingestMsPerBlock > 0 ? blockBytes / o.ingestMsPerBlock : Infinity;
  if (o.transferInterferenceMs === 0) stallLoadBytesPerMs = Infinity;
  // KV capacity: what vLLM's profiling leaves for the cache, unless set outright
  let numGpuBlocks = Math.floor((hw.hbmBytes * preset.gpuMemoryUtilization - m.totalParams * m.weightBytesPerParam - preset.nonKvReserveBytes) / (kvBytesPerToken * blockSize));
  if (presetName === 'default' || o.cacheBlocks !== undefined) numGpuBlocks = Math.floor(((o.cacheBlocks ?? 5000) * unitTokens) / blockSize);
  if (o.numGpuBlocks !== undefined) numGpuBlocks = o.numGpuBlocks;
  /** @type {import('./model/step-time.mjs').StepCost} */
  const cost = {
    flopsPerMs,
    bytesPerMs,
    stepOverheadMs: o.stepOverheadMs ?? preset.stepOverheadMs,
    perSeqMs: o.decodeMsPerSeq ?? preset.perSeqMs,
    linearFlopsPerToken,
    attnFlopsPerPair: 4 * m.layers * m.qHeads * m.headDim,
    denseWeightBytes,
    expertWeightBytes,
    experts: m.experts,
    expertsPerToken: m.expertsPerToken,
    kvBytesPerToken,
  };
  return {
    preset: presetName,
    hardware: hw,
    model: m,
    cost,
    kvBytesPerToken,
    numGpuBlocks: Math.max(0, numGpuBlocks),
    blockSize,
    unitTokens,
    gpuMemoryUtilization: preset.gpuMemoryUtilization,
    maxNumBatchedTokens: o.maxNumBatchedTokens ?? preset.maxNumBatchedTokens,
    maxNumSeqs: o.maxNumSeqs ?? preset.maxNumSeqs,
    preemption: o.preemption ?? preset.preemption,
    linkBytesPerMs,
    stallLoadBytesPerMs,
    prefixMesh: o.prefixMesh ?? preset.prefixMesh,
    fabric: preset.fabric,
  };
}
