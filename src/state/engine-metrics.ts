// Reads the few engine series the router acts on out of a Prometheus text page (GET /metrics).
// Pure: text in, figures out. Names per engine and version (SPEC 8):
//   KV use 0..1   vllm:kv_cache_usage_perc (v1) | vllm:gpu_cache_usage_perc (v0) | sglang:token_usage
//   waiting       vllm:num_requests_waiting | sglang:num_queue_reqs, and on an SGLang decode node
//                 sglang:num_decode_prealloc_queue_reqs + sglang:num_decode_transfer_queue_reqs
//                 (requests sent to D that wait for KV memory or for their KV to arrive: they are
//                 not in its num_queue_reqs yet; scheduler_metrics_mixin.py fills them in DECODE mode)
//   running       vllm:num_requests_running | sglang:num_running_reqs
//   KV capacity   vllm:cache_config_info{block_size,num_gpu_blocks} | sglang:max_total_num_tokens
// SGLang servers name them `sglang:`; `sglang_` (aggregation or Prometheus escaping) is read too. The names of the two
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

/** A line longer than this is no engine's sample (vLLM's widest, `cache_config_info`, is ~1 KB): skipped unread. */
export const MAX_LINE_CHARS = 16_384;

const isLabelNameChar = (c: number) => (c >= 48 && c <= 57) || (c >= 65 && c <= 90) || (c >= 97 && c <= 122) || c === 95;
const isSpace = (c: number) => c === 32 || c === 9;

/**
 * One sample line, `name{labels} value [timestamp]` (labels optional), as the exposition format
 * writes it: label values quoted, with `\\`, `\"` and `\n` escaped (so a quoted `}` or `,` is
 * text). One pass over the line, each character read once: a hostile exporter's long line costs its
 * length, never its square (issue 25: a regular expression's backtracking took 13.7 s on 100 KB).
 * Labels are kept only when `withLabels` (the one series whose figures are labels). Null when the
 * line is not a sample.
 */
export function parseSample(line: string, withLabels = true): { name: string; labels: Record<string, string>; value: number } | null {
  const n = line.length;
  let i = 0;
  while (i < n && line[i] !== "{" && !isSpace(line.charCodeAt(i))) i++;
  if (i === 0) return null;
  const name = line.slice(0, i);
  const labels: Record<string, string> = {};
  if (line[i] === "{") {
    i++;
    for (;;) {
      while (i < n && (isSpace(line.charCodeAt(i)) || line[i] === ",")) i++;
      if (line[i] === "}") break;
      const keyStart = i;
      while (i < n && isLabelNameChar(line.charCodeAt(i))) i++;
      const key = line.slice(keyStart, i);
      while (i < n && isSpace(line.charCodeAt(i))) i++;
      if (!key || line[i] !== "=") return null;
      i++;
      while (i < n && isSpace(line.charCodeAt(i))) i++;
      if (line[i] !== '"') return null;
      i++;
      let value = "";
      let from = i;
      for (;;) {
        if (i >= n) return null;
        const c = line[i];
        if (c === '"') break;
        if (c === "\\") {
          if (withLabels) value += line.slice(from, i) + (line[i + 1] === "n" ? "\n" : (line[i + 1] ?? ""));
          i += 2;
          from = i;
        } else i++;
      }
      if (withLabels) labels[key] = value + line.slice(from, i);
      i++;
    }
    i++;
  } else if (i >= n) return null;
  while (i < n && isSpace(line.charCodeAt(i))) i++;
  const valueStart = i;
  while (i < n && !isSpace(line.charCodeAt(i))) i++;
  const text = line.slice(valueStart, i);
  const value = text === "+Inf" ? Infinity : text === "-Inf" ? -Infinity : text ? Number(text) : Number.NaN;
  return Number.isNaN(value) && text !== "NaN" ? null : { name, labels, value };
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
    if (raw.length > MAX_LINE_CHARS) continue;
    const line = raw.trimStart();
    // only the series read are parsed (a page has a thousand other lines); a comment names none
    const signal = signalOf(line.slice(0, line.search(/[{\s]/)));
    // labels tell the schedulers apart (DP ranks, TP copies) and are cache_config_info's figures
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
