// `policy.disaggregation: "conditional"` (SPEC 8): D first, then whether it prefills alone. Pure.

import { decided, decisionTokens, prefillPoolFor, withPdFallbacks } from "./decision";
import { isBusyFor } from "./kv-guard";
import { decideLocalPrefill, type LocalPrefillAnswer } from "./local-prefill";
import { noneInGroup, preferGroup, walkedTo } from "./pd-group";
import { fail, nodeById, poolOf, type Ranked, rankRole } from "./rank-role";
import type { CandidateNode, Decision, PdReason, Result, RoleDecision, ScoredCandidate, SelectionError, SelectionInput } from "./types";

/**
 * `policy.disaggregation: "conditional"` (SPEC 8): D is picked first by the decode policy (with
 * the KV guard); the prompt's tokens D is predicted not to hold decide whether D prefills it
 * alone (local-prefill.ts); otherwise a P is picked by the prefill policy, its group relative to
 * the chosen D (prefer: P in D's group within the bonus; strict: D's ranking is walked to the
 * first D whose group has a P). A D that would prefill the request anyway is no P for it when
 * another exists (`both` nodes: one pool serving either way).
 */
export function selectDecodeFirst(input: SelectionInput, cursors: Decision["cursors"], rankDecode: () => Result<Ranked, SelectionError>): Result<Decision, SelectionError> {
  const decodePool = poolOf(input, "decode");
  const decode = rankDecode();
  if (!decode.ok) return decode;
  const first = decode.value.decision;
  const guard = input.guard ?? null;
  const thresholds = { tokens: input.policy.localPrefillTokens, ratio: input.policy.localPrefillRatio };
  // D prefills alone: the prefill role names D, with the P candidates looked at (if any). Its
  // fallbacks are the P/D path: should D fail, the next D is no better placed to prefill alone
  // (its share of the prompt was never judged), so the request goes P then D (issue 25 item 5).
  const pdPath = (d: RoleDecision): string[] => {
    const ranked = rankRole(prefillPoolFor(input, d.id));
    return ranked.kind === "ok" ? [ranked.decision.id, ...ranked.decision.fallbacks].filter((id) => id !== d.id) : [];
  };
  const servedLocally = (d: RoleDecision, peeked: ScoredCandidate[], reason: PdReason) => {
    // ranked once: the prefill pool is ranked on every local decision (the hot path)
    const fallbacks = pdPath(d);
    return decided(
      input,
      { id: d.id, rule: "local_prefill", candidates: peeked, fallbacks, failOpen: false },
      withPdFallbacks(d, decodePool, fallbacks.length > 0),
      cursors,
      "local",
      reason,
    );
  };

  // A turn that continues a stored response: only its D holds the state, so D serves it alone.
  if (input.pinned === true) return decided(input, { id: first.id, rule: "local_prefill", candidates: [], fallbacks: [], failOpen: false }, first, cursors, "local", "pinned");

  const strict = input.policy.pdGroup === "strict";
  const busyIds = new Set(first.candidates.filter((c) => c.busy === true).map((c) => c.id));
  const walk = strict ? [first.id, ...first.fallbacks.filter((id) => !busyIds.has(id))] : [first.id];
  const tried: string[] = [];
  for (const [index, did] of walk.entries()) {
    const d = nodeById(decodePool.nodes, did) as CandidateNode;
    if (strict && tried.includes(d.group)) continue;
    tried.push(d.group);
    const decodeDecision: RoleDecision = index === 0 ? first : { ...walkedTo(first, walk.slice(0, index), did, decodePool), rule: "pdgroup_strict", failOpen: false };
    const tokens = decisionTokens(input, null, did);
    const uncachedTokens = tokens.uncachedOnDecode ?? tokens.prompt;
    const question = {
      promptTokens: tokens.prompt,
      uncachedTokens,
      thresholds,
      localPrefill: d.localPrefill === true,
      // busy now, or once this request's uncached tokens are in its KV (Dynamo's decode-busy gate counts the request's own blocks)
      decodeBusy: guard !== null && isBusyFor(d, guard, uncachedTokens),
      prefillBusy: null,
    };
    let answer: LocalPrefillAnswer = decideLocalPrefill(question);
    if (answer.local) return servedLocally(decodeDecision, [], answer.reason);

    const prefillPool = prefillPoolFor(input, did);
    const ranked = strict ? rankRole(prefillPool, d.group) : rankRole(prefillPool);
    if (ranked.kind !== "ok") {
      if (strict) continue;
      return fail({ kind: "no_nodes", role: "prefill" });
    }
    const prefill = input.policy.pdGroup === "prefer" ? preferGroup(ranked, prefillPool, d.group, input.policy.pdGroupBonus) : ranked.decision;
    const p = nodeById(prefillPool.nodes, prefill.id);
    // Dynamo's prefill-load bypass: the P it would get would queue it anyway (ai-dynamo/dynamo
    // lib/kv-router/src/conditional_disagg.rs PrefillLoadPolicy), unless D is busy
    const prefillBusy = p !== undefined && guard !== null && p.signals?.queue != null && p.signals.queue >= guard.queueBusy;
    if (answer.reason === "cold" && prefillBusy) {
      answer = decideLocalPrefill({ ...question, prefillBusy: true });
      if (answer.local) {
        const peeked = prefill.candidates.map((c) => (c.id === prefill.id ? { ...c, queue: p?.signals?.queue ?? null, busy: true } : c));
        return servedLocally(decodeDecision, peeked, answer.reason);
      }
    }
    if (ranked.usedRoundRobin) cursors.prefill += 1;
    const prefillDecision: RoleDecision = strict && index > 0 ? { ...prefill, rule: prefill.rule === "sticky" || prefill.failOpen ? prefill.rule : "pdgroup_strict" } : prefill;
    return decided(input, prefillDecision, decodeDecision, cursors, "disaggregated", answer.reason);
  }
  return noneInGroup("prefill", "decode", tried, input.prefill);
}
