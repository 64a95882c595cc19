import { withFields } from "./body";
import { decodeAttempt, withFailover, type DecodeAnswer, type ForwardContext } from "./pipeline";

// No disaggregation: one hop to a node that prefills and decodes; P and D name the same node.

export async function forwardColocated(ctx: ForwardContext): Promise<DecodeAnswer> {
  const body = withFields(ctx.raw, {});
  const { node, answer } = await withFailover(ctx, "decode", async (node) => ({ node, answer: await decodeAttempt(ctx, node, body, ctx.life.upstreamId()) }));
  return { prefillNode: node.id, decodeNode: node.id, prefillMs: 0, decodeMs: answer.ms, leg: answer.leg, body: answer.body, prefillUsage: null };
}
