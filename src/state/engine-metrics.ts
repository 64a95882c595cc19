// Reads the few engine series the router acts on out of a Prometheus text page (GET /metrics).
// Pure: text in, figures out. Names per engine and version (SPEC 8):
//   KV use 0..1   vllm:kv_cache_usage_perc (v1) | vllm:gpu_cache_usage_perc (v0) | sglang:token_usage
//   waiting       vllm:num_requests_waiting | sglang:num_queue_reqs, and on an SGLang decode node
//                 sglang:num_decode_prealloc_queue_reqs + sglang:num_decode_transfer_queue_reqs
//                 (requests sent to D that wait for KV memory or for their KV to arrive: they are
//                 not in its num_queue_reqs yet; scheduler_metrics_mixin.py fills them in DECODE mode)
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
  /** tokens the KV cache of one engine (DP rank) holds when full: a request lands on one of them */
  kvCapacityTokens: number | null;
  /** engines (vLLM DP engines, SGLang DP ranks) the node's KV is split across; absent: one */
  kvRanks?: number;
  /** vLLM: tokens served from its prefix cache since it started; absent when the page has no such counter */
  prefixCacheHits?: number;
}

type Signal = "kvUsage" | "kvUsageV0" | "waiting" | "running" | "capacity" | "cacheConfig" | "prefixHits";

const NAMES: Record<string, Signal> = {
  "vllm:kv_cache_usage_perc": "kvUsage",
  "vllm:gpu_cache_usage_perc": "kvUsageV0",
  "vllm:num_requests_waiting": "waiting",
  "vllm:num_requests_running": "running",
  "vllm:cache_config_info": "cacheConfig",
  // tokens served from the prefix cache since start (a counter): proof that prefix caching is on and hits
  "vllm:prefix_cache_hits_total": "prefixHits",
  "sglang:token_usage": "kvUsage",
  "sglang:num_queue_reqs": "waiting",
  "sglang:num_decode_prealloc_queue_reqs": "waiting",
  "sglang:num_decode_transfer_queue_reqs": "waiting",
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
 * Labels that tell apart copies of one scheduler's figures, not different schedulers: SGLang with
 * --enable-metrics-for-all-schedulers writes the same figures once per TP and PP rank (labels of
 * python/sglang/srt/managers/scheduler_metrics_mixin.py: model_name, engine_type, tp_rank, pp_rank,
 * moe_ep_rank, and dp_rank when data-parallel — DP ranks are different schedulers and stay apart).
 */
const COPY_LABELS = new Set(["tp_rank", "pp_rank", "moe_ep_rank"]);

/** The scheduler a sample speaks for: its labels without the copy labels. */
function schedulerOf(name: string, labels: Record<string, string>): string {
  let key = name;
  for (const label of Object.keys(labels).sort()) if (!COPY_LABELS.has(label)) key += `\u0000${label}=${labels[label]}`;
  return key;
}

/**
 * The engine's figures from its /metrics text (the whole page, or the part of it that was read).
 * A series repeated per TP/PP rank counts once (COPY_LABELS). A node serving several label sets
 * (vLLM data-parallel engines, SGLang DP ranks, several served model names): waiting and running
 * are summed, KV use is the mean of the sets (a DP engine balances its ranks, so the node is full
 * when they all are), and the capacity is one rank's (the smallest) with `kvRanks` saying how many
 * share the node's KV — a request lands on one engine, so its share of KV is judged against one.
 * Null when none of the series is there (an HTML page, garbage, another program's metrics).
 */
export function readEngineMetrics(text: string): EngineReading | null {
  // a signal's entry exists once a sample of it was read
  const sums: Partial<Record<Signal, { total: number; n: number; min: number }>> = {};
  const seen = new Set<string>();
  for (const raw of text.split("\n")) {
    const line = raw.trimStart();
    // only the series read are parsed (a page has a thousand other lines); a comment names none
    const signal = signalOf(line.slice(0, line.search(/[{\s]/)));
    const sample = signal ? parseSample(line) : null;
    if (!signal || !sample || !Number.isFinite(sample.value)) continue;
    const scheduler = schedulerOf(sample.name, sample.labels);
    if (seen.has(scheduler)) continue;
    seen.add(scheduler);
    let value = sample.value;
    if (signal === "cacheConfig") {
      // an info gauge: the figures are labels (vllm/v1/metrics/loggers.py, log_metrics_info "cache_config")
      const blocks = Number(sample.labels.num_gpu_blocks);
      const size = Number(sample.labels.block_size);
      if (!(blocks > 0 && size > 0)) continue;
      value = blocks * size;
    }
    const acc = sums[signal] ?? { total: 0, n: 0, min: Infinity };
    acc.total += value;
    acc.n += 1;
    acc.min = Math.min(acc.min, value);
    sums[signal] = acc;
  }
  const mean = (s?: { total: number; n: number }) => (s ? s.total / s.n : null);
  const sum = (s?: { total: number; n: number }) => (s ? s.total : null);
  const kv = mean(sums.kvUsage) ?? mean(sums.kvUsageV0);
  const capacity = sums.capacity ?? sums.cacheConfig;
  const reading: EngineReading = {
    kvUsage: kv === null ? null : Math.min(1, Math.max(0, kv)),
    waiting: sum(sums.waiting),
    running: sum(sums.running),
    kvCapacityTokens: capacity ? capacity.min : null,
  };
  if (capacity && capacity.n > 1) reading.kvRanks = capacity.n;
  if (sums.prefixHits) reading.prefixCacheHits = sums.prefixHits.total;
  return reading.kvUsage === null && reading.waiting === null && reading.running === null ? null : reading;
}
