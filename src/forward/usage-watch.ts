import { memberText } from "./json-text";
import { prefillUsageOf, usageHolder } from "./stream";
import type { DataRewrite } from "./sse-reader";

// The usage of an answer the router does not rewrite (a node that prefilled alone: colocated, a
// local prefill, a pinned turn), read for cache-hit feedback: prompt tokens and cached tokens.
// Nothing is changed: the client gets D's bytes as they were.

export interface AnswerUsage {
  promptTokens: number;
  cachedTokens: number;
  /** impossible figures, clamped (stream.ts prefillUsageOf) */
  anomaly?: boolean;
}

/** An answer's usage object (chat, completions or Responses shape) as counts; null without prompt tokens. */
export function usageCounts(holder: Record<string, unknown>): AnswerUsage | null {
  const u = prefillUsageOf(holder);
  return u.promptTokens === null ? null : { promptTokens: u.promptTokens, cachedTokens: u.cachedTokens, ...(u.anomaly ? { anomaly: true } : {}) };
}

/** A whole JSON answer's usage (its top-level `usage` member only is parsed). */
export function jsonAnswerUsage(text: string): AnswerUsage | null {
  const usage = memberText(text, "usage");
  if (usage === undefined) return null;
  try {
    return usageCounts({ usage: JSON.parse(usage) as unknown });
  } catch {
    return null;
  }
}

/**
 * Watches a stream's data lines for its usage frame (the shared SSE reader hands them over, each
 * held at most MAX_DATA_LINE_BYTES) and reports the last one seen; every line passes unchanged.
 */
export function usageObserver(onUsage: (usage: AnswerUsage) => void): DataRewrite {
  return {
    line(value) {
      if (value.includes('"usage"')) {
        // `usage`, or `response.usage` in Responses events
        const holder = usageHolder(value);
        const usage = holder && usageCounts({ usage: holder.usage });
        if (usage) onUsage(usage);
      }
      return value;
    },
  };
}

/**
 * Reads a stream's output tokens from its usage frames as they pass (`completion_tokens`, or
 * `output_tokens` in Responses events; the last one seen wins), before `inner` rewrites the line.
 * An engine may put several tokens in one event (vLLM and SGLang `--stream-interval`, outputs
 * merged for a slow reader, Dynamo's frontend 20 by default), so events alone do not count tokens.
 */
export function outputTokensObserver(inner: DataRewrite | null, onTokens: (tokens: number) => void): DataRewrite {
  return {
    line(value) {
      if (value.includes('"usage"')) {
        const n = usageHolder(value)?.usage;
        const tokens = n?.completion_tokens ?? n?.output_tokens;
        if (typeof tokens === "number" && Number.isFinite(tokens) && tokens >= 0) onTokens(Math.floor(tokens));
      }
      return inner ? inner.line(value) : value;
    },
    ...(inner?.required ? { required: true } : {}),
  };
}
