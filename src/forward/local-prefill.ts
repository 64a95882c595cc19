import { withFields } from "./body";
import { asFailure, decodeAttempt, failOver, type DecodeAnswer, type ForwardContext } from "./pipeline";

// Conditional disaggregation's local prefill (SPEC 8): D gets the client's body alone, with no
// kv_transfer_params, and prefills it itself — a vLLM decode node given no handle computes the
// prompt like any engine: its KV connector loads external tokens only for a request whose params
// say `do_remote_prefill` (vllm-project/vllm vllm/distributed/kv_transfer/kv_connector/v1/
// mooncake/mooncake_connector.py get_num_new_matched_tokens: no params, 0 external tokens; the
// NIXL connector's scheduler side reads them the same way), and its own prefix cache serves what
// it holds. The lease holds D's prefill work until D's first byte, then releases it as a P's.

// A D that fails before its first byte hands the request to the P/D path (`disaggregated`, the
// protocol's own forward): the next D was never judged to hold the prompt, and prefilling all of
// it alone is the interference disaggregation exists to avoid (issue 25 item 5).
export async function forwardLocalPrefill(ctx: ForwardContext, disaggregated: (ctx: ForwardContext) => Promise<DecodeAnswer>): Promise<DecodeAnswer> {
  const body = withFields(ctx.raw, {});
  for (let i = 0; ; i++) {
    const node = ctx.resolve(ctx.life.chosen.decode);
    try {
      const answer = await decodeAttempt(ctx, node, body, ctx.life.upstreamId());
      ctx.life.prefillDone({ node: node.id, outcome: "ok" });
      return { prefillNode: node.id, decodeNode: node.id, prefillMs: 0, decodeMs: answer.ms, leg: answer.leg, body: answer.body, prefillUsage: null };
    } catch (err) {
      await failOver(ctx, asFailure(err, "decode", node.id), i);
      if (!ctx.life.isLocalPrefill) return disaggregated(ctx);
    }
  }
}
