import { memberText } from "./json-text";
import { prefillUsageOf } from "./stream";
import type { ChunkRewriter } from "./stream";

// The usage of an answer the router does not rewrite (a node that prefilled alone: colocated, a
// local prefill, a pinned turn), read for cache-hit feedback: prompt tokens and cached tokens.
// Nothing is changed: the client gets D's bytes as they were.

export interface AnswerUsage {
  promptTokens: number;
  cachedTokens: number;
}

/** Longest SSE line looked into for a usage object; past it the line is passed over (bounded memory). */
const MAX_LINE_CHARS = 1 << 20;

/** An answer's usage object (chat, completions or Responses shape) as counts; null without prompt tokens. */
export function usageCounts(holder: Record<string, unknown>): AnswerUsage | null {
  const u = prefillUsageOf(holder);
  return u.promptTokens === null ? null : { promptTokens: u.promptTokens, cachedTokens: u.cachedTokens };
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

/** One SSE line's usage, when it is a `data:` JSON event carrying one (`usage`, or `response.usage` in Responses events). */
function lineUsage(line: string): AnswerUsage | null {
  if (!line.startsWith("data:")) return null;
  try {
    const event = JSON.parse(line.slice(5)) as { usage?: unknown; response?: { usage?: unknown } } | null;
    if (!event || typeof event !== "object") return null;
    if (event.usage && typeof event.usage === "object") return usageCounts({ usage: event.usage });
    if (event.response?.usage && typeof event.response.usage === "object") return usageCounts({ usage: event.response.usage });
  } catch {
    // not JSON: no usage
  }
  return null;
}

/**
 * Watches a stream for its usage frame and reports the last one seen; every byte passes on
 * unchanged. Only lines containing `"usage"` are parsed; a line held for that is at most 1 MB.
 */
export function sseUsageObserver(onUsage: (usage: AnswerUsage) => void): ChunkRewriter {
  const decoder = new TextDecoder();
  let line = "";
  let skipping = false;
  const inspect = () => {
    if (!skipping && line.includes('"usage"')) {
      const usage = lineUsage(line.trim());
      if (usage) onUsage(usage);
    }
    line = "";
    skipping = false;
  };
  return {
    chunk(bytes) {
      const text = decoder.decode(bytes, { stream: true });
      let start = 0;
      for (;;) {
        const nl = text.indexOf("\n", start);
        if (nl < 0) {
          if (!skipping) line += text.slice(start);
          if (line.length > MAX_LINE_CHARS) {
            line = "";
            skipping = true;
          }
          return bytes;
        }
        if (!skipping) line += text.slice(start, nl);
        inspect();
        start = nl + 1;
      }
    },
    flush() {
      line += decoder.decode();
      inspect();
      return new Uint8Array(0);
    },
  };
}
