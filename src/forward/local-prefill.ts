import { forwardColocated } from "./colocated";
import type { DecodeAnswer, ForwardContext } from "./pipeline";

// Conditional disaggregation's local prefill (SPEC 8): D gets the client's body alone, with no
// kv_transfer_params, and prefills it itself — a vLLM decode node given no handle computes the
// prompt like any engine: its KV connector loads external tokens only for a request whose params
// say `do_remote_prefill` (vllm-project/vllm vllm/distributed/kv_transfer/kv_connector/v1/
// mooncake/mooncake_connector.py get_num_new_matched_tokens: no params, 0 external tokens; the
// NIXL connector's scheduler side reads them the same way), and its own prefix cache serves what
// it holds. The lease holds D's prefill work until D's first byte, then releases it as a P's.

export async function forwardLocalPrefill(ctx: ForwardContext): Promise<DecodeAnswer> {
  const answer = await forwardColocated(ctx);
  ctx.life.prefillDone({ node: answer.decodeNode, outcome: "ok" });
  return answer;
}
