// `disaggregation: "predicted"` (SPEC 9): among every (P, D) pair the policies rank and every
// local option on a decode-capable D, the one predicted to give the first token soonest, the
// prefilling node paying for the decode steps it lengthens (D prefilling alone, or a P that also
// decodes: on `both` nodes every option prefills beside decoding sequences). Pure: `selectPredicted` ranks both pools and
// applies the choice that `choosePredicted` makes. Cheap: P's prefill time and D's part are computed once a node, so a pair costs an
// addition (64 x 64 nodes: 4,096 of them).

import { decided, movedTo, withPdFallbacks } from "./decision";
import {
  DEFAULT_PROFILE,
  KV_BYTES_PER_TOKEN,
  type PredictedNode,
  profileRates,
  beatsIncumbent,
  decodeLoadMs,
  decodeSide,
  hasKvRoom,
  localPrediction,
  prefillDoneMs,
  prefillHarmMs,
  type RequestSize,
  remoteAfterPrefillMs,
} from "./predict";
import { fail, nodeById, type Pool, poolOf, type Ranked, rankRole } from "./rank-role";
import type { CandidateNode, Decision, PdMode, PdReason, Result, Role, RoleDecision, ScoredCandidate, SelectionError, SelectionInput } from "./types";
import { promptTokensOf, uncachedTokensOf } from "./work";

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
  /**
   * every node of both pools prefills and decodes (`both` nodes, as colocated serving): the
   * decode policy's first D alone is the policies' pick, and only another node alone may take the
   * request from it (choosePredicted)
   */
  allBoth?: boolean;
}

/**
 * An option; `harmMs`: what its prefill adds to the decode steps of the node that runs it (0 on a
 * prefill-only P), plus its D's decode load over the least loaded D's (when every D is decode-only).
 */
export type PredictedChoice =
  | { mode: "disaggregated"; prefill: string; decode: string; ttftMs: number; harmMs: number }
  | { mode: "local"; decode: string; ttftMs: number; harmMs: number };

/** What /v1/route shows per node: the best option through it (ms). */
export interface NodeFigures {
  predictedTtftMs: number;
  /** D: prefilling alone (null: not an option there) and the decode harm it would do */
  localTtftMs?: number | null;
  decodeHarmMs?: number;
  /** D: its decode load over the least loaded D's (predict.ts decodeLoadMs) */
  decodeLoadMs?: number;
}

export interface PredictedAnswer {
  choice: PredictedChoice;
  /** per node of each role (a `both` node is in both) */
  figures: { prefill: Map<string, NodeFigures>; decode: Map<string, NodeFigures> };
}

const score = (c: PredictedChoice): number => c.ttftMs + c.harmMs;

/**
 * The option predicted soonest (TTFT plus the decode harm of its prefill). The policies' own pick —
 * their first D with their first P that may pair with it, or that D alone when both policies put it
 * first (`both` nodes) and it may prefill alone — keeps the request unless that option beats it by
 * the margin (predict.ts STICKY_MARGIN). Null when there is no option at all (one
 * node that may not prefill alone).
 *
 * On a pool of `both` nodes (`allBoth`) every option prefills beside decoding sequences, so the
 * harm only says whose steps to lengthen, and moving a request off its warm node for it recomputes
 * the prefix there: the decode policy's first D alone (colocated serving's choice) is the pick, and
 * another node alone takes the request only when predicted faster by the margin and no worse on
 * TTFT plus harm. A split between two `both` nodes is not taken over D alone: measured request by
 * request, every one was slower than the same request colocated (docs/predicted-log.md, stops 41, 44).
 * When that D may not prefill alone (no KV room, `localPrefill` off) the rule above applies.
 */
export function choosePredicted(q: PredictedQuestion): PredictedAnswer | null {
  const firstD = q.decodes[0];
  const prefills = q.prefills;
  const prefillMs = prefills.map((p) => prefillDoneMs(p.node, p.size));
  const harmOfP = prefills.map((p) => prefillHarmMs(p.node, p.size));
  // each P's best pair (its figure); the pairs themselves are numbers, an object only for a D's best
  // (64 x 64 nodes are 4,096 pairs a request: allocating each was most of the decision's time)
  const bestOfP = prefills.map(() => Infinity);
  const figures = { prefill: new Map<string, NodeFigures>(), decode: new Map<string, NodeFigures>() };
  let best: PredictedChoice | null = null;
  let incumbent: PredictedChoice | null = null;
  // decode load over the least loaded D: a D's harm beside its options' prefill harm. Among
  // decode-only Ds alone: a `both` node's decoding sequences are priced by the decode harm of every
  // prefill it would run, and pricing their load too cost both-8 TTFT for no TPOT (docs/predicted.md)
  const priced = q.decodes.every((d) => d.node.decodeOnly === true);
  // ms a sequence: the candidates' mean, so only the sequences decoding on each D tell them apart
  const perSeq = priced ? q.decodes.reduce((sum, d) => sum + d.node.rates.decodeMsPerSeq, 0) / q.decodes.length : 0;
  const loads = q.decodes.map((d) => (priced ? decodeLoadMs(d.node, perSeq) : 0));
  const least = Math.min(...loads);
  const locals: PredictedChoice[] = [];

  for (let j = 0; j < q.decodes.length; j++) {
    const d = q.decodes[j]!;
    const load = loads[j]! - least;
    const side = decodeSide(d.node, d.size);
    let bestAt = -1;
    let bestScore = Infinity;
    let bestMs = Infinity;
    for (let i = 0; i < prefills.length; i++) {
      const p = prefills[i]!;
      if (p.id === d.id || (q.sameGroup && p.group !== d.group)) continue;
      const ms = remoteAfterPrefillMs(prefillMs[i]!, side);
      if (d === firstD && incumbent === null) incumbent = { mode: "disaggregated", prefill: p.id, decode: d.id, ttftMs: ms, harmMs: harmOfP[i]! + load };
      if (ms + harmOfP[i]! < bestScore) {
        bestScore = ms + harmOfP[i]!;
        bestMs = ms;
        bestAt = i;
      }
      if (ms < bestOfP[i]!) bestOfP[i] = ms;
    }
    const bestHere: PredictedChoice | null =
      bestAt < 0 ? null : { mode: "disaggregated", prefill: prefills[bestAt]!.id, decode: d.id, ttftMs: bestMs, harmMs: harmOfP[bestAt]! + load };
    const local = d.localPrefill && hasKvRoom(d.kvUsage, d.kvCapacityTokens, d.size.promptTokens, q.kvBusy) ? localPrediction(d.node, d.size) : null;
    const localChoice: PredictedChoice | null = local ? { mode: "local", decode: d.id, ttftMs: local.ttftMs, harmMs: local.harmMs + load } : null;
    // both policies put one node first (`both` nodes), or every node is one: their own pick is that node alone
    if (d === firstD && localChoice && (q.allBoth === true || prefills[0]?.id === d.id)) incumbent = localChoice;
    if (localChoice) locals.push(localChoice);
    const options: PredictedChoice[] = [...(bestHere ? [bestHere] : []), ...(localChoice ? [localChoice] : [])];
    for (const o of options) if (best === null || score(o) < score(best)) best = o;
    const f: NodeFigures = {
      predictedTtftMs: Math.min(bestHere?.ttftMs ?? Infinity, local?.ttftMs ?? Infinity),
      localTtftMs: local ? local.ttftMs : null,
    };
    if (local) f.decodeHarmMs = local.harmMs;
    if (load > 0) f.decodeLoadMs = load;
    figures.decode.set(d.id, f);
  }
  prefills.forEach((p, i) => {
    if (Number.isFinite(bestOfP[i])) figures.prefill.set(p.id, harmOfP[i]! > 0 ? { predictedTtftMs: bestOfP[i]!, decodeHarmMs: harmOfP[i]! } : { predictedTtftMs: bestOfP[i]! });
  });
  if (best === null) return null;
  const keep = incumbent as PredictedChoice | null;
  if (q.allBoth === true && keep !== null && keep.mode === "local") {
    let faster: PredictedChoice = keep;
    for (const o of locals) if (beatsIncumbent(o.ttftMs, keep.ttftMs) && score(o) < score(faster)) faster = o;
    return { choice: faster, figures };
  }
  return { choice: keep !== null && !beatsIncumbent(score(best), score(keep)) ? keep : best, figures };
}

// ---------------------------------------------------------------------------------------------
// Predicted disaggregation: every pair and every local option, by predicted TTFT

const DEFAULT_RATES = profileRates(DEFAULT_PROFILE);
const round1 = (x: number): number => Math.round(x * 10) / 10;

/**
 * `policy.disaggregation: "predicted"` (SPEC 9): both pools are ranked by their policies (bounds,
 * the KV guard and stickiness as ever); every P and D they would take — under their in-flight
 * bounds (over cache_aware's share bound too: the prediction prices a node's queue), not busy —
 * is an option, paired with every other (inside one group under pdGroup strict; `prefer` is not
 * applied), and every such D that may prefill alone is a local option too. The choice is
 * select-predicted.ts's; the candidates carry each node's rates and predicted TTFT.
 */
export function selectPredicted(input: SelectionInput, cursors: Decision["cursors"], rankDecode: () => Result<Ranked, SelectionError>): Result<Decision, SelectionError> {
  const decodePool = poolOf(input, "decode");
  const decode = rankDecode();
  if (!decode.ok) return decode;
  const first = decode.value.decision;
  const served = (prefill: RoleDecision, d: RoleDecision, mode: PdMode, reason: PdReason) => decided(input, prefill, d, cursors, mode, reason);
  if (input.pinned === true) return served({ id: first.id, rule: "local_prefill", candidates: [], fallbacks: [], failOpen: false }, first, "local", "pinned");

  const prefillPool = poolOf(input, "prefill");
  const prefill = rankRole(prefillPool);
  if (prefill.kind !== "ok") return fail({ kind: "no_nodes", role: "prefill" });
  const chars = input.promptChars ?? 0;
  const blockChars = input.policy.cacheAware.blockChars;
  const sizeOn = (n: CandidateNode, role: Role) => ({
    promptTokens: promptTokensOf(chars, n.charsPerToken),
    uncachedTokens: uncachedTokensOf(chars, input.prefixMatches[role][n.id] ?? 0, blockChars, n.charsPerToken),
  });
  const optionsOf = (r: Ranked, pool: Pool): CandidateNode[] =>
    [r.decision.id, ...[...r.preferred, ...r.overShare].filter((id) => id !== r.decision.id)]
      .map((id) => nodeById(pool.nodes, id))
      .filter((n): n is CandidateNode => n !== undefined);
  const prefillIds = new Set(prefillPool.nodes.map((n) => n.id));
  const answer = choosePredicted({
    prefills: optionsOf(prefill, prefillPool).map((n) => ({ id: n.id, group: n.group, node: predictedNode(n), size: sizeOn(n, "prefill") })),
    decodes: optionsOf(decode.value, decodePool).map((n) => ({
      id: n.id,
      group: n.group,
      node: predictedNode(n, !prefillIds.has(n.id)),
      size: sizeOn(n, "decode"),
      localPrefill: n.localPrefill === true,
      kvUsage: n.signals?.kvUsage ?? null,
      kvCapacityTokens: n.signals?.kvCapacityTokens ?? null,
    })),
    sameGroup: input.policy.pdGroup === "strict",
    kvBusy: input.guard?.kvBusy ?? 1,
    allBoth: prefillPool.nodes.length === decodePool.nodes.length && decodePool.nodes.every((n) => prefillIds.has(n.id)),
  });
  if (answer === null) {
    if (prefill.usedRoundRobin) cursors.prefill += 1;
    return served(prefill.decision, first, "disaggregated", "predicted");
  }
  const { choice, figures } = answer;
  const shown = (d: RoleDecision, pool: Pool, byId: Map<string, NodeFigures>): RoleDecision => ({
    ...d,
    candidates: d.candidates.map((c) => withPrediction(c, nodeById(pool.nodes, c.id), byId.get(c.id))),
  });
  const decodeDecision = shown(choice.decode === first.id ? first : movedTo(first, choice.decode), decodePool, figures.decode);
  const prefillCandidates = shown(prefill.decision, prefillPool, figures.prefill).candidates;
  let result: Result<Decision, SelectionError>;
  if (choice.mode === "local") {
    // should D fail, the request goes P then D (issue 25 item 5): the ranked Ps are its fallbacks
    const pdPath = [prefill.decision.id, ...prefill.decision.fallbacks].filter((id) => id !== choice.decode);
    result = served(
      { id: choice.decode, rule: "local_prefill", candidates: prefillCandidates, fallbacks: pdPath, failOpen: false },
      withPdFallbacks(decodeDecision, decodePool, pdPath.length > 0),
      "local",
      "predicted",
    );
  } else {
    if (prefill.usedRoundRobin) cursors.prefill += 1;
    const p = prefill.decision;
    const prefillDecision = { ...(choice.prefill === p.id ? p : movedTo(p, choice.prefill)), candidates: prefillCandidates };
    result = served(prefillDecision, decodeDecision, "disaggregated", "predicted");
  }
  if (result.ok) result.value.predictedTtftMs = round1(choice.ttftMs);
  return result;
}

/** The node as the prediction reads it: its rates (the defaults' without learned ones), its queue, its decoding sequences. */
function predictedNode(n: CandidateNode, decodeOnly = false): PredictedNode {
  return {
    rates: n.rates ?? DEFAULT_RATES,
    prefillTokens: n.prefillTokens ?? 0,
    ...(n.prefillCost !== undefined ? { prefillCost: n.prefillCost } : {}),
    prefillRequests: n.prefillRequests ?? 0,
    waiting: n.signals?.queue ?? null,
    decoding: n.decoding ?? 0,
    ...(n.decodingTokens !== undefined ? { decodingTokens: n.decodingTokens } : {}),
    ...(decodeOnly ? { decodeOnly } : {}),
  };
}

/**
 * A candidate as /v1/route shows it under prediction: its learned rates and the best option through
 * it. Written into the candidate the ranking just built for this request (a copy of each, 128 of
 * them at 64 nodes, cost more than the rest of the decision).
 */
function withPrediction(c: ScoredCandidate, n: CandidateNode | undefined, f: NodeFigures | undefined): ScoredCandidate {
  const rates = n?.rates ?? DEFAULT_RATES;
  const out = c;
  out.prefillMsPerToken = Math.round(rates.prefillMsPerToken * 1e4) / 1e4;
  out.decodeStepMs = round1(rates.decodeStepMs);
  out.decodeMsPerSeq = Math.round(rates.decodeMsPerSeq * 100) / 100;
  out.transferMsPerGB = round1((rates.transferMsPerToken * 1e9) / KV_BYTES_PER_TOKEN);
  out.handoffMs = round1(rates.handoffMs);
  if (f) {
    out.predictedTtftMs = round1(f.predictedTtftMs);
    if (f.localTtftMs !== undefined) out.localTtftMs = f.localTtftMs === null ? null : round1(f.localTtftMs);
    if (f.decodeHarmMs !== undefined) out.decodeHarmMs = round1(f.decodeHarmMs);
    if (f.decodeLoadMs !== undefined) out.decodeLoadMs = round1(f.decodeLoadMs);
  }
  return out;
}
