import { withFields } from "./body";
import type { DecodeAnswer, ForwardContext } from "./pipeline";
import { bootstrapHost, forwardConcurrent } from "./sglang";
import { prefillUsageOf, type PrefillUsage } from "./stream";
import { UpstreamFailure, type UpstreamNode } from "./upstream";
import { continuesStoredResponse, decodeAlone, vllmPrefillBody } from "./vllm";

// vLLM's MooncakeConnector flow, as its proxy runs it (vllm-project/vllm
// examples/disaggregated/mooncake_connector/mooncake_connector_proxy.py, and
// vllm/distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_connector.py
// `update_state_after_alloc`): P and D are sent at once with a router-made transfer_id; D is
// told P's bootstrap address and engine id and pulls the KV P registers under that id. P's
// engine id comes from P's bootstrap server (`GET /query`, MooncakeBootstrapServer in
// mooncake_utils.py), learned once and kept until P fails (a restarted P has a new id).

/** Engine ids learned from P bootstrap servers, by bootstrap address. Data shared by requests, never a pending read. */
const engineIds = new Map<string, { engineId: string; at: number }>();
const ENGINE_ID_TTL_MS = 5 * 60_000;

export const bootstrapAddr = (p: UpstreamNode) => {
  const host = bootstrapHost(p.url);
  return `http://${host.includes(":") ? `[${host}]` : host}:${p.bootstrapPort}`;
};

/** P's engine id (data-parallel rank 0) from its bootstrap server's `/query`. */
export async function engineIdOf(p: UpstreamNode, signal: AbortSignal, now = Date.now()): Promise<string> {
  const addr = bootstrapAddr(p);
  const known = engineIds.get(addr);
  if (known && now - known.at < ENGINE_ID_TTL_MS) return known.engineId;
  const fail = (what: string) => new UpstreamFailure("prefill", p.id, "connect", `prefill node ${p.id}'s Mooncake bootstrap server ${what}`);
  let res: Response;
  try {
    res = await fetch(`${addr}/query`, { signal: AbortSignal.any([signal, AbortSignal.timeout(5_000)]), redirect: "manual" });
  } catch (err) {
    throw fail(`is unreachable: ${(err as Error).message}`);
  }
  if (res.status !== 200) {
    await res.body?.cancel();
    throw fail(`answered HTTP ${res.status}`);
  }
  let engineId: unknown;
  try {
    const ranks = (await res.json()) as Record<string, { engine_id?: unknown }>;
    engineId = (ranks["0"] ?? Object.values(ranks)[0])?.engine_id;
  } catch {
    // fall through
  }
  if (typeof engineId !== "string" || !engineId) throw fail("gave no engine_id");
  engineIds.set(addr, { engineId, at: now });
  return engineId;
}

export const forgetEngineId = (p: UpstreamNode) => engineIds.delete(bootstrapAddr(p));

export function forwardVllmMooncake(ctx: ForwardContext): Promise<DecodeAnswer> {
  if (continuesStoredResponse(ctx.parsed)) return decodeAlone(ctx);
  // P's answer arrives beside D's stream; the usage frame at its end shows P's counts (0 cached until then).
  const usage: PrefillUsage = { promptTokens: null, cachedTokens: 0 };
  return forwardConcurrent(
    ctx,
    async (p, _d, upstreamId) => {
      let engineId: string;
      try {
        engineId = await engineIdOf(p, ctx.life.signal);
      } catch (err) {
        forgetEngineId(p);
        throw err;
      }
      const transferId = JSON.stringify(`xfer-${upstreamId}`);
      return {
        prefill: vllmPrefillBody(ctx.raw, ctx.parsed, `{"do_remote_decode":true,"do_remote_prefill":false,"transfer_id":${transferId}}`),
        decode: withFields(ctx.raw, {
          kv_transfer_params: `{"do_remote_decode":false,"do_remote_prefill":true,"remote_bootstrap_addr":${JSON.stringify(bootstrapAddr(p))},"remote_engine_id":${JSON.stringify(engineId)},"transfer_id":${transferId}}`,
        }),
        onPrefillAnswer: (text) => {
          try {
            Object.assign(usage, prefillUsageOf(JSON.parse(text) as Record<string, unknown>));
          } catch {
            // P's answer is not shown to anyone; only its counts matter
          }
        },
        // D names P by the engine id P had when it was asked; a restarted P has a new one and D
        // fails its transfer: ask P's bootstrap server again on the next attempt or request
        onFailure: () => forgetEngineId(p),
      };
    },
    usage,
  );
}
