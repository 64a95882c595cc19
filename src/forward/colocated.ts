import { withFields } from "./body";
import { runLeg, type ForwardContext, type ForwardResult } from "./pipeline";

// No disaggregation: one hop to a node that prefills and decodes; P and D name the same node.

export async function forwardColocated(ctx: ForwardContext): Promise<ForwardResult> {
  const body = withFields(ctx.raw, ctx.parsed, {});
  const decode = await runLeg(ctx, "decode", ctx.timeouts.decodeFirstByteMs, () => body, async (leg) => leg);
  return { prefillNode: decode.node.id, decodeNode: decode.node.id, prefillMs: 0, decode: decode.value, decodeMs: decode.ms, cachedTokens: null };
}
