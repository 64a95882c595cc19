// Reads the few engine series the router acts on out of a Prometheus text page (GET /metrics).
// Pure: text in, figures out. Names per engine and version (SPEC 8):
//   KV use 0..1   vllm:kv_cache_usage_perc (v1) | vllm:gpu_cache_usage_perc (v0) | sglang:token_usage
//   waiting       vllm:num_requests_waiting | sglang:num_queue_reqs
//   running       vllm:num_requests_running | sglang:num_running_reqs
//   KV capacity   vllm:cache_config_info{block_size,num_gpu_blocks} | sglang:max_total_num_tokens
// SGLang <= 0.5.3 names them `sglang:`, >= 0.5.4 `sglang_`: both are read. The names of the two
// engines never collide, so every name is looked for whatever the protocol (colocated may be either).
// vLLM: vllm/v1/metrics/loggers.py (PrometheusStatLogger); SGLang: python/sglang/srt/metrics/collector.py.

/** What one /metrics page says about the engine; null where the page did not carry the series. */
export interface EngineReading {
  /** KV cache in use, 0..1 */
  kvUsage: number | null;
  /** requests waiting in the engine's queue */
  waiting: number | null;
  /** requests the engine is running */
  running: number | null;
  /** tokens the KV cache holds when full */
  kvCapacityTokens: number | null;
}

type Signal = "kvUsage" | "kvUsageV0" | "waiting" | "running" | "capacity" | "cacheConfig";

const NAMES: Record<string, Signal> = {
  "vllm:kv_cache_usage_perc": "kvUsage",
  "vllm:gpu_cache_usage_perc": "kvUsageV0",
  "vllm:num_requests_waiting": "waiting",
  "vllm:num_requests_running": "running",
  "vllm:cache_config_info": "cacheConfig",
  "sglang:token_usage": "kvUsage",
  "sglang:num_queue_reqs": "waiting",
  "sglang:num_running_reqs": "running",
  "sglang:max_total_num_tokens": "capacity",
};

/** The signal a series name carries, if any; SGLang >= 0.5.4's `sglang_` names read as `sglang:`. */
const signalOf = (name: string): Signal | undefined => NAMES[name.replace(/^sglang_/, "sglang:")];

/**
 * One sample line, `name{labels} value [timestamp]` (labels optional), as the exposition format
 * writes it: label values quoted, with `\\`, `\"` and `\n` escaped (so a quoted `}` or `,` is
 * text). Each alternative starts with a different character: no ambiguity a long line could make slow.
 */
const SAMPLE = /^([^{\s]+)(?:\{((?:[^"}]|"(?:[^"\\]|\\.)*")*)\}\s*|\s+)(\S+)/;
const LABEL = /(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"/g;

/** One sample line; null when the line is not one. */
export function parseSample(line: string): { name: string; labels: Record<string, string>; value: number } | null {
  const m = SAMPLE.exec(line);
  if (!m) return null;
  const labels: Record<string, string> = {};
  for (const [, key, raw] of (m[2] ?? "").matchAll(LABEL)) labels[key as string] = (raw as string).replace(/\\(.)/g, (_, c: string) => (c === "n" ? "\n" : c));
  const text = m[3] as string;
  const value = text === "+Inf" ? Infinity : text === "-Inf" ? -Infinity : Number(text);
  return Number.isNaN(value) && text !== "NaN" ? null : { name: m[1] as string, labels, value };
}

/**
 * The engine's figures from its /metrics text (the whole page, or the part of it that was read).
 * A node serving several label sets (vLLM data-parallel engines, SGLang DP ranks, several served
 * model names): waiting, running and capacity are summed, KV use is the mean of the sets (a DP
 * engine balances its ranks, so the node is full when they all are). Null when none of the series
 * is there (an HTML page, garbage, another program's metrics).
 */
export function readEngineMetrics(text: string): EngineReading | null {
  // a signal's entry exists once a sample of it was read
  const sums: Partial<Record<Signal, { total: number; n: number }>> = {};
  for (const raw of text.split("\n")) {
    const line = raw.trimStart();
    // only the series read are parsed (a page has a thousand other lines); a comment names none
    const signal = signalOf(line.slice(0, line.search(/[{\s]/)));
    const sample = signal ? parseSample(line) : null;
    if (!signal || !sample || !Number.isFinite(sample.value)) continue;
    let value = sample.value;
    if (signal === "cacheConfig") {
      // an info gauge: the figures are labels (vllm/v1/metrics/loggers.py, log_metrics_info "cache_config")
      const blocks = Number(sample.labels.num_gpu_blocks);
      const size = Number(sample.labels.block_size);
      if (!(blocks > 0 && size > 0)) continue;
      value = blocks * size;
    }
    const acc = sums[signal] ?? { total: 0, n: 0 };
    acc.total += value;
    acc.n += 1;
    sums[signal] = acc;
  }
  const mean = (s?: { total: number; n: number }) => (s ? s.total / s.n : null);
  const sum = (s?: { total: number; n: number }) => (s ? s.total : null);
  const kv = mean(sums.kvUsage) ?? mean(sums.kvUsageV0);
  const reading: EngineReading = {
    kvUsage: kv === null ? null : Math.min(1, Math.max(0, kv)),
    waiting: sum(sums.waiting),
    running: sum(sums.running),
    kvCapacityTokens: sum(sums.capacity) ?? sum(sums.cacheConfig),
  };
  return reading.kvUsage === null && reading.waiting === null && reading.running === null ? null : reading;
}
