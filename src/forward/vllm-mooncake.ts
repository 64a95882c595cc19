import { withFields } from "./body";
import { decodeContact, releasesUnreadHandle } from "./handle-release";
import type { DecodeAnswer, ForwardContext } from "./pipeline";
import { forwardConcurrent } from "./sglang";
import { prefillUsageOf, type PrefillUsage } from "./stream";
import { UpstreamFailure, type UpstreamNode } from "./upstream";
import { usageDetailsOf } from "../observability/usage-details";
import { continuesStoredResponse, decodeAlone, releaseHandle, vllmPrefillBody } from "./vllm";

// vLLM's MooncakeConnector flow, as its proxy runs it (vllm-project/vllm
// examples/disaggregated/mooncake_connector/mooncake_connector_proxy.py, and
// vllm/distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_connector.py
// `update_state_after_alloc`): P and D are sent at once with a router-made transfer_id; D is
// told P's bootstrap address and the engine id of the data-parallel rank P serves it on, and
// pulls the KV P registers under that id. The engine ids come from P's bootstrap server
// (`GET /query`, MooncakeBootstrapServer in mooncake_utils.py: one entry per DP rank), learned
// once and kept until P fails (a restarted P has new ids).

/** Engine ids of a P's data-parallel ranks (index = rank), by bootstrap address. Data shared by requests, never a pending read. */
const engineIds = new Map<string, { ranks: string[]; at: number }>();
const ENGINE_ID_TTL_MS = 5 * 60_000;
/** The next rank per P: the proxy cycles every P's ranks in turn (`prefiller_cycle`). */
const nextRank = new Map<string, number>();

/** Test seam: no engine ids learned, as in a new isolate (the Worker tests share one isolate across files). */
export function forgetEngineIdsForTests(): void {
  engineIds.clear();
  nextRank.clear();
}

/**
 * P's bootstrap server as D reaches it: P's bootstrapHost (IPv6 in brackets, as the proxy's
 * `maybe_wrap_ipv6_address` writes it) and bootstrapPort (default 8998, VLLM_MOONCAKE_BOOTSTRAP_PORT).
 */
export const bootstrapAddr = (p: UpstreamNode) => `http://${p.bootstrapHost}:${p.bootstrapPort}`;

/** The engine ids of P's DP ranks, from its bootstrap server's `/query` (through the node's reach, like every request to it). */
export async function engineIdsOf(p: UpstreamNode, signal: AbortSignal, now = Date.now()): Promise<string[]> {
  const addr = bootstrapAddr(p);
  const known = engineIds.get(addr);
  if (known && now - known.at < ENGINE_ID_TTL_MS) return known.ranks;
  const fail = (what: string) => new UpstreamFailure("prefill", p.id, "connect", `prefill node ${p.id}'s Mooncake bootstrap server ${what}`);
  let res: Response;
  try {
    res = await p.access.fetch(new URL("/query", addr), {
      headers: { ...p.access.headers },
      signal: AbortSignal.any([signal, AbortSignal.timeout(5_000)]),
      redirect: "manual",
    });
  } catch (err) {
    throw fail(`is unreachable: ${(err as Error).message}`);
  }
  if (res.status !== 200) {
    await res.body?.cancel();
    throw fail(`answered HTTP ${res.status}`);
  }
  let ranks: string[] = [];
  try {
    ranks = ranksOf(await res.json());
  } catch {
    // reported below
  }
  if (ranks.length === 0) throw fail("gave no engine_id");
  engineIds.set(addr, { ranks, at: now });
  return ranks;
}

/** `{"<dp_rank>": {"engine_id": ...}, ...}` as a list by rank; empty when any rank from 0 up lacks an id. */
export function ranksOf(query: unknown): string[] {
  if (!query || typeof query !== "object") return [];
  const entries = query as Record<string, { engine_id?: unknown } | undefined>;
  const ranks: string[] = [];
  for (let rank = 0; ; rank++) {
    const id = entries[String(rank)]?.engine_id;
    if (typeof id !== "string" || !id) break;
    ranks.push(id);
  }
  return ranks.length === Object.keys(entries).length ? ranks : [];
}

export const forgetEngineIds = (p: UpstreamNode) => engineIds.delete(bootstrapAddr(p));

/** The DP rank this request uses on P: P's ranks in turn. */
function pickRank(p: UpstreamNode, count: number): number {
  const addr = bootstrapAddr(p);
  const rank = (nextRank.get(addr) ?? 0) % count;
  nextRank.set(addr, rank + 1);
  return rank;
}

export function forwardVllmMooncake(ctx: ForwardContext): Promise<DecodeAnswer> {
  if (continuesStoredResponse(ctx.parsed)) return decodeAlone(ctx);
  // P's answer arrives beside D's stream; the usage frame at its end shows P's counts (0 cached until then).
  const usage: PrefillUsage = { promptTokens: null, cachedTokens: 0 };
  return forwardConcurrent(
    ctx,
    async (p, _d, upstreamId) => {
      let ranks: string[];
      try {
        ranks = await engineIdsOf(p, ctx.life.signal);
      } catch (err) {
        forgetEngineIds(p);
        throw err;
      }
      const rank = pickRank(p, ranks.length);
      const transferId = JSON.stringify(`xfer-${upstreamId}`);
      const decodeKv = `{"do_remote_decode":false,"do_remote_prefill":true,"remote_bootstrap_addr":${JSON.stringify(bootstrapAddr(p))},"remote_engine_id":${JSON.stringify(ranks[rank])},"transfer_id":${transferId}}`;
      return {
        prefill: vllmPrefillBody(ctx.raw, ctx.parsed, `{"do_remote_decode":true,"do_remote_prefill":false,"transfer_id":${transferId}}`),
        // vLLM's API server routes a request to the DP rank this header names (serving.py `_get_data_parallel_rank`)
        prefillHeaders: { "x-data-parallel-rank": String(rank) },
        decode: withFields(ctx.raw, { kv_transfer_params: decodeKv }),
        onPrefillAnswer: (text) => {
          try {
            const json = JSON.parse(text) as Record<string, unknown>;
            Object.assign(usage, prefillUsageOf(json));
            ctx.life.noteUsageDetails(p.id, usageDetailsOf(json));
          } catch {
            // P's answer is not shown to anyone; only its counts matter
          }
        },
        onFailure: (decode, prefillAnswered) => {
          // D names P by the engine id P had when it was asked; a restarted P has new ones and D
          // fails its transfer: ask P's bootstrap server again on the next attempt or request
          forgetEngineIds(p);
          // P finished its prefill and holds the blocks under transfer_id until D asks for them,
          // or VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT (480 s). A D that rejects a request carrying
          // them tells P to let go (MooncakeConnectorScheduler.request_finished: do_remote_prefill
          // still set -> an empty receive -> P's send_kv_to_decode frees the transfer), exactly as
          // for a NIXL handle: sent only when no D got this attempt's request (handle-release.ts).
          if (prefillAnswered && releasesUnreadHandle(decodeContact(decode, ctx.stream), ctx.decodeNotifiesP?.(decode.node))) {
            ctx.life.background(() => releaseHandle(ctx, ctx.resolve(ctx.life.chosen.decode), decodeKv));
          }
        },
      };
    },
    usage,
  );
}
