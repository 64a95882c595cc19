// /metrics pages as real engines write them (Prometheus text 0.0.4), for tests. Series, labels and
// help texts follow vLLM v1 (vllm/v1/metrics/loggers.py: PrometheusStatLogger) and SGLang
// (python/sglang/srt/metrics/collector.py), with the histograms and counters around them that a
// reader must skip.

export interface EngineFigures {
  kvUsage: number;
  waiting: number;
  running: number;
  /** vLLM: num_gpu_blocks x block_size; SGLang: max_total_num_tokens */
  capacityTokens?: number;
  model?: string;
}

export function vllmMetricsText(f: EngineFigures, engines = 1): string {
  const model = f.model ?? "sim-model";
  const lines: string[] = [
    "# HELP python_gc_objects_collected_total Objects collected during gc",
    "# TYPE python_gc_objects_collected_total counter",
    'python_gc_objects_collected_total{generation="0"} 18162.0',
  ];
  const each = (name: string, help: string, type: string, value: (e: number) => string, extra = "") => {
    lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`);
    for (let e = 0; e < engines; e++) lines.push(`${name}{engine="${e}",model_name="${model}"${extra}} ${value(e)}`);
  };
  each("vllm:num_requests_running", "Number of requests in model execution batches.", "gauge", () => (f.running / engines).toFixed(1));
  each("vllm:num_requests_waiting", "Number of requests waiting to be processed.", "gauge", () => (f.waiting / engines).toFixed(1));
  each("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "gauge", () => String(f.kvUsage));
  each("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.", "counter", () => "12800.0");
  lines.push("# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.", "# TYPE vllm:time_to_first_token_seconds histogram");
  for (const le of ["0.001", "0.005", "0.01", "0.02", "0.04", "+Inf"]) lines.push(`vllm:time_to_first_token_seconds_bucket{engine="0",le="${le}",model_name="${model}"} 3.0`);
  lines.push(`vllm:time_to_first_token_seconds_sum{engine="0",model_name="${model}"} 0.0123`);
  if (f.capacityTokens !== undefined) {
    const blocks = Math.round(f.capacityTokens / 16 / engines);
    lines.push("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig", "# TYPE vllm:cache_config_info gauge");
    for (let e = 0; e < engines; e++) {
      lines.push(
        `vllm:cache_config_info{block_size="16",cache_dtype="auto",calculate_kv_scales="False",cpu_offload_gb="0",enable_prefix_caching="True",engine="${e}",gpu_memory_utilization="0.9",is_attention_free="False",num_cpu_blocks="None",num_gpu_blocks="${blocks}",num_gpu_blocks_override="None",prefix_caching_hash_algo="builtin",sliding_window="None",swap_space="4",swap_space_bytes="4294967296"} 1.0`,
      );
    }
  }
  return lines.join("\n") + "\n";
}

/** SGLang's page: `sglang:` names up to 0.5.3, `sglang_` from 0.5.4. */
export function sglangMetricsText(f: EngineFigures, prefix: "sglang:" | "sglang_" = "sglang:", ranks = 1): string {
  const model = f.model ?? "sim-model";
  const lines: string[] = [];
  const each = (name: string, help: string, value: (r: number) => string) => {
    lines.push(`# HELP ${prefix}${name} ${help}`, `# TYPE ${prefix}${name} gauge`);
    for (let r = 0; r < ranks; r++) lines.push(`${prefix}${name}{engine_type="unified",model_name="${model}",moe_ep_rank="0",pp_rank="0",tp_rank="${r}"} ${value(r)}`);
  };
  each("num_running_reqs", "The number of running requests.", () => (f.running / ranks).toFixed(1));
  each("num_used_tokens", "The number of used tokens.", () => "1024.0");
  each("token_usage", "The token usage.", () => String(f.kvUsage));
  each("num_queue_reqs", "The number of requests in the waiting queue.", () => (f.waiting / ranks).toFixed(1));
  if (f.capacityTokens !== undefined) each("max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", () => String(f.capacityTokens! / ranks));
  each("cache_hit_rate", "The prefix cache hit rate.", () => "0.5");
  return lines.join("\n") + "\n";
}
