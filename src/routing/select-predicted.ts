// `disaggregation: "predicted"` (SPEC 9): among every (P, D) pair the policies rank and every
// local option on a decode-capable D, the one predicted to give the first token soonest, a local
// option paying for the decode steps it lengthens. Pure; select.ts ranks the pools and applies
// the choice. Cheap: P's prefill time and D's part are computed once a node, so a pair costs an
// addition (64 x 64 nodes: 4,096 of them).
import { beatsIncumbent, decodeSide, hasKvRoom, localPrediction, type PredictedNode, prefillDoneMs, type RequestSize, remoteAfterPrefillMs } from "./predict";

/** One candidate of a role as the choice reads it, in the policy's order (the first is the policy's pick). */
export interface PredictedCandidate {
  id: string;
  group: string;
  node: PredictedNode;
  /** the request's size on this node (its own tokenizer, its own cache) */
  size: RequestSize;
}

export interface DecodeCandidate extends PredictedCandidate {
  /** may prefill alone (node `localPrefill`) */
  localPrefill: boolean;
  /** the engine's projected KV use and capacity (local prefill's KV room) */
  kvUsage: number | null;
  kvCapacityTokens: number | null;
}

export interface PredictedQuestion {
  prefills: PredictedCandidate[];
  decodes: DecodeCandidate[];
  /** pdGroup strict: a pair stays inside one group */
  sameGroup: boolean;
  kvBusy: number;
}

export type PredictedChoice = { mode: "disaggregated"; prefill: string; decode: string; ttftMs: number } | { mode: "local"; decode: string; ttftMs: number; harmMs: number };

/** What /v1/route shows per node: the best option through it (ms). */
export interface NodeFigures {
  predictedTtftMs: number;
  /** D: prefilling alone (null: not an option there) and the decode harm it would do */
  localTtftMs?: number | null;
  decodeHarmMs?: number;
}

export interface PredictedAnswer {
  choice: PredictedChoice;
  /** per node of each role (a `both` node is in both) */
  figures: { prefill: Map<string, NodeFigures>; decode: Map<string, NodeFigures> };
}

const score = (c: PredictedChoice): number => c.ttftMs + (c.mode === "local" ? c.harmMs : 0);

/**
 * The option predicted soonest (TTFT plus a local option's decode harm). The policies' own pair —
 * their first D with their first P that may pair with it — keeps the request unless that option
 * beats it by the margin (predict.ts STICKY_MARGIN). Null when there is no option at all (one
 * node that may not prefill alone).
 */
export function choosePredicted(q: PredictedQuestion): PredictedAnswer | null {
  const firstD = q.decodes[0];
  const prefillMs = q.prefills.map((p) => prefillDoneMs(p.node, p.size));
  const figures = { prefill: new Map<string, NodeFigures>(), decode: new Map<string, NodeFigures>() };
  let best: PredictedChoice | null = null;
  let incumbent: PredictedChoice | null = null;

  for (const d of q.decodes) {
    const side = decodeSide(d.node, d.size);
    let bestHere: PredictedChoice | null = null;
    q.prefills.forEach((p, i) => {
      if (p.id === d.id || (q.sameGroup && p.group !== d.group)) return;
      const pair: PredictedChoice = { mode: "disaggregated", prefill: p.id, decode: d.id, ttftMs: remoteAfterPrefillMs(prefillMs[i]!, side) };
      if (d === firstD && incumbent === null) incumbent = pair;
      if (bestHere === null || pair.ttftMs < bestHere.ttftMs) bestHere = pair;
      const pf = figures.prefill.get(p.id);
      if (pf === undefined || pair.ttftMs < pf.predictedTtftMs) figures.prefill.set(p.id, { predictedTtftMs: pair.ttftMs });
    });
    const local = d.localPrefill && hasKvRoom(d.kvUsage, d.kvCapacityTokens, d.size.promptTokens, q.kvBusy) ? localPrediction(d.node, d.size) : null;
    const options: PredictedChoice[] = [...(bestHere ? [bestHere] : []), ...(local ? [{ mode: "local" as const, decode: d.id, ...local }] : [])];
    for (const o of options) if (best === null || score(o) < score(best)) best = o;
    const f: NodeFigures = {
      predictedTtftMs: Math.min((bestHere as PredictedChoice | null)?.ttftMs ?? Infinity, local?.ttftMs ?? Infinity),
      localTtftMs: local ? local.ttftMs : null,
    };
    if (local) f.decodeHarmMs = local.harmMs;
    figures.decode.set(d.id, f);
  }
  if (best === null) return null;
  const keep = incumbent as PredictedChoice | null;
  return { choice: keep !== null && !beatsIncumbent(score(best), score(keep)) ? keep : best, figures };
}
