import { editMembers } from "./json-text";
import type { DataRewrite } from "./sse-reader";

// The client's usage: what P's counts make of D's, in a whole answer or in a stream's usage line
// (the stream itself is read by sse-reader.ts).

/** A stream's data lines with the usage fixed: only a line carrying `"usage"` is parsed, every other byte kept. */
export const usageRewrite = (fix: (usage: Record<string, unknown>) => void): DataRewrite => ({
  line: (value) => (value.includes('"usage"') ? fixUsageInBody(value, fix) : value),
});

/**
 * The member of a completion object (or Responses API event) that holds the usage: `usage`
 * itself, or `response` whose `usage` it is (a Responses object inside `response.completed`).
 */
export function usageHolder(json: string): { member: "usage" | "response"; value: Record<string, unknown>; usage: Record<string, unknown> } | null {
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
  /** P reported impossible figures (a negative count, cached tokens above the prompt): clamped */
  anomaly?: boolean;
}

type UsageShape = {
  prompt_tokens?: unknown;
  prompt_tokens_details?: { cached_tokens?: unknown } | null;
  input_tokens?: unknown;
  input_tokens_details?: { cached_tokens?: unknown } | null;
};

/**
 * P's usage as P reported it (vLLM omits prompt_tokens_details when nothing was cached: that is
 * 0). Chat, completions or Responses shape. What reaches the client is clamped to what can be
 * true — counts whole and non-negative, cached tokens at most the prompt — and an answer that
 * needed it is marked, to be counted against P.
 */
export function prefillUsageOf(json: Record<string, unknown>): PrefillUsage {
  const usage = json.usage as UsageShape | undefined;
  const cached = usage?.prompt_tokens_details?.cached_tokens ?? usage?.input_tokens_details?.cached_tokens;
  const prompt = usage?.prompt_tokens ?? usage?.input_tokens;
  const count = (v: unknown, max: number) => (typeof v === "number" && Number.isFinite(v) ? Math.min(max, Math.max(0, Math.floor(v))) : null);
  const promptTokens = count(prompt, Number.MAX_SAFE_INTEGER);
  const cachedTokens = count(cached, promptTokens ?? Number.MAX_SAFE_INTEGER) ?? 0;
  const anomaly = (typeof prompt === "number" && prompt !== promptTokens) || (typeof cached === "number" && cached !== cachedTokens);
  return { promptTokens, cachedTokens, ...(anomaly ? { anomaly } : {}) };
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
