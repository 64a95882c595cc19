// What every mode of select.ts ends with: the decision, its tokens, and the fallbacks of a local
// prefill or a node moved off the policy's pick. Pure.

import { nodeById, isAvailable, type Pool, poolOf } from "./rank-role";
import type { Decision, DecisionTokens, PdMode, PdReason, Result, RoleDecision, SelectionError, SelectionInput } from "./types";
import { promptTokensOf, uncachedTokensOf } from "./work";

/** The decision with its mode, reason and the request's size for the nodes picked. */
export function decided(
  input: SelectionInput,
  prefill: RoleDecision,
  decode: RoleDecision,
  cursors: Decision["cursors"],
  mode: PdMode,
  reason: PdReason,
): Result<Decision, SelectionError> {
  // the node that prefills: P when disaggregated (also a pinned turn's, which P never prefills: D does)
  const prefiller = mode === "disaggregated" ? prefill.id : null;
  return { ok: true, value: { prefill, decode, cursors, mode, reason, tokens: decisionTokens(input, prefiller, decode.id) } };
}

/** The prompt's tokens on D, what D and the prefilling node lack (at least 1: every request is some work). */
export function decisionTokens(input: SelectionInput, prefiller: string | null, decodeId: string): DecisionTokens {
  const chars = input.promptChars ?? 0;
  const blockChars = input.policy.cacheAware.blockChars;
  const d = nodeById(input.decode, decodeId);
  const uncachedOnDecode = chars > 0 ? uncachedTokensOf(chars, input.prefixMatches.decode[decodeId] ?? 0, blockChars, d?.charsPerToken) : null;
  const p = prefiller === null ? undefined : nodeById(input.prefill, prefiller);
  const onPrefill = prefiller === null ? uncachedOnDecode : chars > 0 ? uncachedTokensOf(chars, input.prefixMatches.prefill[prefiller] ?? 0, blockChars, p?.charsPerToken) : null;
  return {
    prompt: promptTokensOf(chars, d?.charsPerToken),
    uncachedOnDecode,
    prefillWork: Math.max(1, onPrefill ?? 0),
    decodeWork: Math.max(1, uncachedOnDecode ?? 0),
  };
}

/** A local prefill fails over to any D when a P/D path exists (it goes P then D), else only to decode nodes that may prefill alone too. */
export function withPdFallbacks(d: RoleDecision, pool: Pool, pd: boolean): RoleDecision {
  return pd ? d : { ...d, fallbacks: d.fallbacks.filter((id) => nodeById(pool.nodes, id)?.localPrefill === true) };
}

/** The prefill pool for a request whose D is `decodeId`: without that node while another may take work. */
export function prefillPoolFor(input: SelectionInput, decodeId: string): Pool {
  const pool = poolOf(input, "prefill");
  const others = pool.nodes.filter((n) => n.id !== decodeId);
  return others.some(isAvailable) ? { ...pool, nodes: others } : pool;
}

/** The prediction took another node of the policy's ranking: the policy's pick becomes its first fallback. */
export function movedTo(d: RoleDecision, id: string): RoleDecision {
  return { ...d, id, rule: "predicted", fallbacks: [d.id, ...d.fallbacks].filter((f) => f !== id), failOpen: false };
}
