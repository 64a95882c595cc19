// Picks the prefill and decode node of one request (SPEC 5). Pure and synchronous: the shell
// gathers the nodes, loads, health, key, prefix matches and cursors, and applies the Decision.

import { decided } from "./decision";
import { preferGroup, strictGroup } from "./pd-group";
import { fail, nodeById, poolOf, rankRole, type Ranked } from "./rank-role";
import { selectDecodeFirst } from "./select-conditional";
import { selectPredicted } from "./select-predicted";
import type { Decision, PdMode, PdReason, Result, SelectionError, SelectionInput } from "./types";

export { DECODE_KEY_DISCRIMINATOR, roleKey } from "./rank-role";
export { decisionTokens } from "./decision";

export function selectRoute(input: SelectionInput): Result<Decision, SelectionError> {
  const cursors = { ...input.cursors };
  const decodePool = poolOf(input, "decode");
  const decode = (): Result<Ranked, SelectionError> => {
    const ranked = rankRole(decodePool);
    if (ranked.kind === "busy") return fail({ kind: "decode_busy", candidates: ranked.candidates });
    if (ranked.kind !== "ok") return fail({ kind: "no_nodes", role: "decode" });
    if (ranked.usedRoundRobin) cursors.decode += 1;
    return { ok: true, value: ranked };
  };

  if (input.colocated) {
    const d = decode();
    if (!d.ok) return d;
    const { id, fallbacks, failOpen } = d.value.decision;
    return decided(input, { id, rule: "colocated", candidates: [], fallbacks: [...fallbacks], failOpen }, d.value.decision, cursors, "colocated", "always");
  }
  if (input.policy.disaggregation === "conditional") return selectDecodeFirst(input, cursors, decode);
  if (input.policy.disaggregation === "predicted") return selectPredicted(input, cursors, decode);

  const prefillPool = poolOf(input, "prefill");
  const prefill = rankRole(prefillPool);
  if (prefill.kind !== "ok") return fail({ kind: "no_nodes", role: "prefill" });
  if (decodePool.nodes.length === 0) return fail({ kind: "no_nodes", role: "decode" });
  if (prefill.usedRoundRobin) cursors.prefill += 1;
  // A turn that continues a stored response is served by its D alone (forward/vllm.ts decodeAlone);
  // P is still picked and leased, as before conditional disaggregation existed.
  const [mode, reason]: [PdMode, PdReason] = input.pinned === true ? ["local", "pinned"] : ["disaggregated", "always"];

  if (input.policy.pdGroup === "strict") {
    const strict = strictGroup(prefill, prefillPool, decodePool);
    if (!strict.ok) return strict;
    if (strict.value.decodeUsedRoundRobin) cursors.decode += 1;
    return decided(input, strict.value.prefill, strict.value.decode, cursors, mode, reason);
  }
  const d = decode();
  if (!d.ok) return d;
  const group = input.policy.pdGroup === "prefer" ? nodeById(prefillPool.nodes, prefill.decision.id)?.group : undefined;
  const decodeDecision = group === undefined ? d.value.decision : preferGroup(d.value, decodePool, group, input.policy.pdGroupBonus);
  return decided(input, prefill.decision, decodeDecision, cursors, mode, reason);
}
