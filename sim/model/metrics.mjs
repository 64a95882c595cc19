// GET /metrics of a simulated engine: the series real vLLM and SGLang servers expose, in the
// Prometheus text format, with the values the engine model computes (KV usage, queue, batch).
//
// vLLM v1 (vllm/v1/metrics/loggers.py PrometheusStatLogger): gauges labelled
// {engine, model_name} — `vllm:num_requests_running`, `vllm:num_requests_waiting`,
// `vllm:kv_cache_usage_perc` (0..1; `vllm:gpu_cache_usage_perc` before 0.9, the `v0` option);
// counters get prometheus_client's `_total` suffix (`vllm:prompt_tokens_total`, ...); and the info
// gauge `vllm:cache_config_info` carries every CacheConfig field as a label (CacheConfig.metrics_info:
// `{key: str(value) for key, value in self.__dict__.items()}`, plus `engine`) with the value 1.
// SGLang (python/sglang/srt/metrics/collector.py SchedulerMetricsCollector; labels from
// managers/scheduler_metrics_mixin.py: model_name, engine_type, tp_rank, pp_rank):
// `sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage` (used tokens / pool,
// evictable radix-cache tokens counted free), `sglang:max_total_num_tokens`. Some SGLang builds and
// sgl-router's aggregation write the prefix `sglang_` instead (sglang issue #12618, PR #15758):
// the `sglang_` option.

/**
 * @typedef {object} MetricsSnapshot
 * @property {string} modelName
 * @property {number} kvUsage 0..1
 * @property {number} waiting
 * @property {number} running
 * @property {number} blockSize
 * @property {number} numGpuBlocks
 * @property {number} gpuMemoryUtilization
 * @property {number} promptTokens counter
 * @property {number} generationTokens counter
 * @property {number} preemptions counter
 * @property {number} prefixQueries tokens looked up in the prefix cache (counter)
 * @property {number} prefixHits tokens found there (counter)
 *
 * @typedef {{ kind: 'vllm' | 'sglang', vllmMetrics?: 'v1' | 'v0', sglangPrefix?: 'sglang:' | 'sglang_' }} MetricsFlavor
 */

/** @param {string} v */
function escapeLabel(v) {
  return v.replace(/\\/g, '\\\\').replace(/\n/g, '\\n').replace(/"/g, '\\"');
}

/** @param {Record<string, string | number>} labels */
function labelText(labels) {
  return `{${Object.entries(labels)
    .map(([k, v]) => `${k}="${escapeLabel(String(v))}"`)
    .join(',')}}`;
}

/** Numbers as prometheus_client writes them (floats keep a decimal point). @param {number} v */
function value(v) {
  if (!Number.isFinite(v)) return v > 0 ? '+Inf' : v < 0 ? '-Inf' : 'NaN';
  return Number.isInteger(v) ? `${v}.0` : String(v);
}

/**
 * One gauge or counter family.
 * @param {string} name @param {'gauge' | 'counter'} type @param {string} help
 * @param {Record<string, string | number>} labels @param {number} v
 */
function family(name, type, help, labels, v) {
  const sample = type === 'counter' ? `${name}_total` : name;
  return `# HELP ${name} ${help}\n# TYPE ${name} ${type}\n${sample}${labelText(labels)} ${value(v)}\n`;
}

/**
 * The engine's /metrics body.
 * @param {MetricsFlavor} flavor @param {MetricsSnapshot} s
 */
export function renderMetrics(flavor, s) {
  if (flavor.kind === 'sglang') return renderSglang(flavor.sglangPrefix ?? 'sglang:', s);
  return renderVllm(flavor.vllmMetrics ?? 'v1', s);
}

/** @param {'v1' | 'v0'} version @param {MetricsSnapshot} s */
function renderVllm(version, s) {
  const l = { engine: '0', model_name: s.modelName };
  let out = '';
  out += family('vllm:num_requests_running', 'gauge', 'Number of requests in model execution batches.', l, s.running);
  out += family('vllm:num_requests_waiting', 'gauge', 'Number of requests waiting to be processed.', l, s.waiting);
  if (version === 'v0') out += family('vllm:gpu_cache_usage_perc', 'gauge', 'GPU KV-cache usage. 1 means 100 percent usage.', l, s.kvUsage);
  else out += family('vllm:kv_cache_usage_perc', 'gauge', 'KV-cache usage. 1 means 100 percent usage.', l, s.kvUsage);
  out += family('vllm:prefix_cache_queries', 'counter', 'Prefix cache queries, in terms of number of queried tokens.', l, s.prefixQueries);
  out += family('vllm:prefix_cache_hits', 'counter', 'Prefix cache hits, in terms of number of cached tokens.', l, s.prefixHits);
  out += family('vllm:num_preemptions', 'counter', 'Cumulative number of preemption from the engine.', l, s.preemptions);
  out += family('vllm:prompt_tokens', 'counter', 'Number of prefill tokens processed.', l, s.promptTokens);
  out += family('vllm:generation_tokens', 'counter', 'Number of generation tokens processed.', l, s.generationTokens);
  // every CacheConfig field as a label, as vLLM writes them (a representative set: a parser must
  // find block_size and num_gpu_blocks wherever they are)
  const cacheConfig = {
    block_size: s.blockSize,
    cache_dtype: 'auto',
    calculate_kv_scales: 'False',
    cpu_offload_gb: 0,
    enable_prefix_caching: 'True',
    engine: '0',
    gpu_memory_utilization: s.gpuMemoryUtilization,
    is_attention_free: 'False',
    kv_sharing_fast_prefill: 'False',
    mamba_page_size_padded: 'None',
    num_cpu_blocks: 'None',
    num_gpu_blocks: s.numGpuBlocks,
    num_gpu_blocks_override: 'None',
    prefix_caching_hash_algo: 'sha256',
    sliding_window: 'None',
    swap_space: 4,
  };
  out += `# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info${labelText(cacheConfig)} 1.0\n`;
  return out;
}

/** @param {'sglang:' | 'sglang_'} prefix @param {MetricsSnapshot} s */
function renderSglang(prefix, s) {
  const l = { engine_type: 'unified', model_name: s.modelName, pp_rank: '0', tp_rank: '0' };
  const maxTokens = s.numGpuBlocks * s.blockSize;
  let out = '';
  out += family(`${prefix}num_running_reqs`, 'gauge', 'The number of running requests.', l, s.running);
  out += family(`${prefix}num_used_tokens`, 'gauge', 'The number of used tokens.', l, Math.round(s.kvUsage * maxTokens));
  out += family(`${prefix}token_usage`, 'gauge', 'The token usage.', l, s.kvUsage);
  out += family(`${prefix}num_queue_reqs`, 'gauge', 'The number of requests in the waiting queue.', l, s.waiting);
  out += family(`${prefix}cache_hit_rate`, 'gauge', 'The prefix cache hit rate.', l, s.prefixQueries > 0 ? s.prefixHits / s.prefixQueries : 0);
  out += family(`${prefix}max_total_num_tokens`, 'gauge', 'Maximum total number of tokens in the KV cache pool.', l, maxTokens);
  out += family(`${prefix}prompt_tokens`, 'counter', 'Number of prefill tokens processed.', l, s.promptTokens);
  out += family(`${prefix}generation_tokens`, 'counter', 'Number of generation tokens processed.', l, s.generationTokens);
  return out;
}

/**
 * Valid-looking series for the `huge` metrics fault: `bytes` of padding gauges, then the real
 * body, so only a reader that ignores its size bound ever sees the real values.
 * @param {string} body the real body @param {number} bytes
 */
export function* hugeMetrics(body, bytes) {
  let sent = 0;
  let i = 0;
  const target = Math.max(0, bytes - body.length);
  while (sent < target) {
    const line = `sim:padding_series{shard="${i++}"} 0.0\n`;
    const chunk = line.repeat(Math.max(1, Math.min(2000, Math.ceil((target - sent) / line.length))));
    sent += chunk.length;
    yield chunk;
  }
  yield body;
}
