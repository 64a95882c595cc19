import type { Role } from "../routing/types";
import { withFields } from "./body";
import { readLegJson, UpstreamFailure } from "./upstream";
import { runLeg, type ForwardContext, type ForwardResult } from "./pipeline";

// vLLM disaggregated serving with a KV connector (NIXL-style; also LMCache, Mooncake store):
// P prefills with max_tokens 1 and hands back kv_transfer_params, then D decodes with them.

const PREFILL_KV_PARAMS = {
  do_remote_decode: true,
  do_remote_prefill: false,
  remote_engine_id: null,
  remote_block_ids: null,
  remote_host: null,
  remote_port: null,
};

const DROPPED_ON_PREFILL = ["stream_options", "min_tokens", "min_completion_tokens", "bootstrap_host", "bootstrap_port", "bootstrap_room"];

export function vllmPrefillBody(parsed: Record<string, unknown>): string {
  const body: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(parsed)) if (!DROPPED_ON_PREFILL.includes(k)) body[k] = v;
  body.stream = false;
  body.max_tokens = 1;
  if ("max_completion_tokens" in parsed) body.max_completion_tokens = 1;
  body.kv_transfer_params = PREFILL_KV_PARAMS;
  return JSON.stringify(body);
}

export function vllmDecodeBody(raw: string, parsed: Record<string, unknown>, kvTransferParams: unknown): string {
  // P may stop on EOS and send no params: D then prefills by itself, so still forward.
  return kvTransferParams === undefined || kvTransferParams === null
    ? withFields(raw, parsed, {})
    : withFields(raw, parsed, { kv_transfer_params: JSON.stringify(kvTransferParams) });
}

/** usage.prompt_tokens_details.cached_tokens as P reported it, if it did. */
export function cachedTokensOf(json: Record<string, unknown>): number | null {
  const usage = json.usage as { prompt_tokens_details?: { cached_tokens?: unknown } } | undefined;
  const cached = usage?.prompt_tokens_details?.cached_tokens;
  return typeof cached === "number" ? cached : null;
}

export async function forwardVllm(ctx: ForwardContext): Promise<ForwardResult> {
  const prefillBody = vllmPrefillBody(ctx.parsed);
  const prefill = await runLeg(ctx, "prefill" as Role, ctx.timeouts.prefillMs, () => prefillBody, async (leg, node) => {
    const json = await readLegJson("prefill", node.id, leg.response);
    return json;
  });
  ctx.prefillDone({ node: prefill.node.id, outcome: "ok", ms: prefill.ms });
  const kv = prefill.value.kv_transfer_params;
  const decodeBody = vllmDecodeBody(ctx.raw, ctx.parsed, kv);
  const decode = await runLeg(ctx, "decode", ctx.timeouts.decodeFirstByteMs, () => decodeBody, async (leg) => leg);
  return {
    prefillNode: prefill.node.id,
    decodeNode: decode.node.id,
    prefillMs: prefill.ms,
    decode: decode.value,
    decodeMs: decode.ms,
    cachedTokens: cachedTokensOf(prefill.value),
  };
}

export { UpstreamFailure };
