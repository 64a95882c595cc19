import { editMembers } from "./json-text";

// Rewriting a decode stream where the client's usage must show P's counts, and the usage
// arithmetic itself. Relaying the stream: decode-source.ts (D's side), client-stream.ts (the
// client's side), batch.ts (several prompts merged).

/** Rewrites a stream's bytes chunk by chunk; `flush` returns what it still holds at the end. */
export interface ChunkRewriter {
  chunk(bytes: Uint8Array): Uint8Array;
  flush(): Uint8Array;
}

const encoder = new TextEncoder();

/** Lines longer than this are passed on without being held for rewriting (a D that never sends a newline). */
export const MAX_REWRITE_LINE_BYTES = 1 << 20;

const NEWLINE = 0x0a;

function concat(parts: Uint8Array[]): Uint8Array {
  if (parts.length === 1) return parts[0]!;
  const out = new Uint8Array(parts.reduce((n, p) => n + p.byteLength, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.byteLength;
  }
  return out;
}

/**
 * Rewrites the SSE `data:` lines that carry a usage object, passing every other byte through.
 * Linear in the bytes: each byte is looked at once when its line completes; a partial line is
 * held (as chunks, never re-concatenated) up to MAX_REWRITE_LINE_BYTES, past which it flows on
 * unchanged. Chunks without a `"usage"` are forwarded as the same bytes.
 */
export function sseUsageRewriter(fix: (usage: Record<string, unknown>) => void): ChunkRewriter {
  const decoder = new TextDecoder();
  let held: Uint8Array[] = [];
  let heldBytes = 0;
  /** the current line outgrew the limit: pass it through up to its newline */
  let passing = false;
  const rewriteText = (bytes: Uint8Array): Uint8Array => {
    const text = decoder.decode(bytes);
    if (!text.includes('"usage"')) return bytes;
    return encoder.encode(
      text
        .split("\n")
        .map((line) => rewriteUsageLine(line, fix))
        .join("\n"),
    );
  };
  return {
    chunk(bytes) {
      const nl = bytes.lastIndexOf(NEWLINE);
      if (nl < 0) {
        if (passing) return bytes;
        held.push(bytes);
        heldBytes += bytes.byteLength;
        if (heldBytes <= MAX_REWRITE_LINE_BYTES) return new Uint8Array(0);
        passing = true;
        const out = concat(held);
        held = [];
        heldBytes = 0;
        return out;
      }
      const head = bytes.subarray(0, nl + 1);
      const rest = bytes.subarray(nl + 1);
      let out: Uint8Array;
      if (passing) {
        // the over-long line ends at the first newline; the lines after it are rewritten as usual
        const first = head.indexOf(NEWLINE);
        out = concat([head.subarray(0, first + 1), rewriteText(head.subarray(first + 1))]);
        passing = false;
      } else {
        out = rewriteText(held.length ? concat([...held, head]) : head);
      }
      held = rest.byteLength ? [rest] : [];
      heldBytes = rest.byteLength;
      return out;
    },
    flush() {
      const out = held.length ? (passing ? concat(held) : rewriteText(concat(held))) : new Uint8Array(0);
      held = [];
      heldBytes = 0;
      return out;
    },
  };
}

/** Rewrites one SSE `data:` line whose JSON carries a usage object; the rest of the line is kept byte for byte. */
export function rewriteUsageLine(line: string, fix: (usage: Record<string, unknown>) => void): string {
  if (!line.startsWith("data:") || !line.includes('"usage"')) return line;
  const json = line.slice(5).trim();
  const fixed = fixUsageInBody(json, fix);
  return fixed === json ? line : `data: ${fixed}`;
}

/**
 * The member of a completion object (or Responses API event) that holds the usage: `usage`
 * itself, or `response` whose `usage` it is (a Responses object inside `response.completed`).
 */
function usageHolder(json: string): { member: "usage" | "response"; value: Record<string, unknown>; usage: Record<string, unknown> } | null {
  try {
    const event = JSON.parse(json) as { usage?: unknown; response?: { usage?: unknown } };
    if (event.usage && typeof event.usage === "object") return { member: "usage", value: event.usage as Record<string, unknown>, usage: event.usage as Record<string, unknown> };
    const response = event.response;
    if (response && typeof response === "object" && response.usage && typeof response.usage === "object") {
      return { member: "response", value: response as Record<string, unknown>, usage: response.usage as Record<string, unknown> };
    }
  } catch {
    // not JSON: nothing to fix
  }
  return null;
}

/** P's token counts: what P prefilled and how much of it P had cached. */
export interface PrefillUsage {
  promptTokens: number | null;
  cachedTokens: number;
}

type UsageShape = {
  prompt_tokens?: unknown;
  prompt_tokens_details?: { cached_tokens?: unknown } | null;
  input_tokens?: unknown;
  input_tokens_details?: { cached_tokens?: unknown } | null;
};

/** P's usage as P reported it (vLLM omits prompt_tokens_details when nothing was cached: that is 0). Chat, completions or Responses shape. */
export function prefillUsageOf(json: Record<string, unknown>): PrefillUsage {
  const usage = json.usage as UsageShape | undefined;
  const cached = usage?.prompt_tokens_details?.cached_tokens ?? usage?.input_tokens_details?.cached_tokens;
  const prompt = usage?.prompt_tokens ?? usage?.input_tokens;
  return { promptTokens: typeof prompt === "number" ? prompt : null, cachedTokens: typeof cached === "number" ? cached : 0 };
}

/**
 * D's usage as the client should see it: D counts the KV it pulled from P as cached, so the
 * prompt counts and cached tokens come from P, and the total is recomputed
 * (vllm-project/router merges usage the same way).
 */
export function fixUsage(p: PrefillUsage): (usage: Record<string, unknown>) => void {
  return (usage) => {
    // Responses API usage names the same counts input/output tokens
    const [prompt, details, completion] =
      "input_tokens" in usage ? ["input_tokens", "input_tokens_details", "output_tokens"] : ["prompt_tokens", "prompt_tokens_details", "completion_tokens"];
    if (p.promptTokens !== null) usage[prompt] = p.promptTokens;
    const held = usage[details] && typeof usage[details] === "object" ? (usage[details] as Record<string, unknown>) : {};
    usage[details] = { ...held, cached_tokens: p.cachedTokens };
    const promptTokens = typeof usage[prompt] === "number" ? (usage[prompt] as number) : 0;
    const completionTokens = typeof usage[completion] === "number" ? (usage[completion] as number) : 0;
    usage.total_tokens = promptTokens + completionTokens;
  };
}

/** A completion object's (or Responses event's) text with its usage fixed; every other member byte for byte. */
export function fixUsageInBody(text: string, fix: (usage: Record<string, unknown>) => void): string {
  const holder = usageHolder(text);
  if (!holder) return text;
  fix(holder.usage);
  return editMembers(text, { [holder.member]: JSON.stringify(holder.value) });
}
