// Picks the prefill and decode node of one request (SPEC 5). Pure and synchronous: the shell
// gathers the nodes, loads, health, key, prefix matches and cursors, and applies the Decision.

import { loadBound } from "./bounded-load";
import { isBusyFor, kvBarrier } from "./kv-guard";
import { decideLocalPrefill, type LocalPrefillAnswer } from "./local-prefill";
import { DEFAULT_PROFILE, KV_BYTES_PER_TOKEN, type PredictedNode, profileRates } from "./predict";
import { compareIds, rendezvousScore } from "./rendezvous";
import { choosePredicted, type NodeFigures } from "./select-predicted";
import type {
  CandidateNode,
  Decision,
  DecisionRule,
  DecisionTokens,
  GuardSettings,
  PdMode,
  PdReason,
  PolicyName,
  Result,
  Role,
  RoleDecision,
  ScoredCandidate,
  SelectionError,
  SelectionInput,
} from "./types";
import { promptTokensOf, uncachedTokensOf, workWeightedLoads } from "./work";

/**
 * cache_aware's recent share: each request counts its tokens plus this fraction of the pool's mean
 * tokens a request (its decoding and KV, which a prefill-token count misses). Measured on the
 * Mooncake trace (8 nodes; max/mean in prefill tokens, in requests): 0 gives 1.01 and 1.69 (one
 * node holding a much-reused prefix takes its cheap turns without end), 1 gives 1.08-1.12 and
 * 1.38-1.41 (over the 1.10 target), 0.5 gives about 1.06 and 1.46, at the best hit ratio of the three.
 */
const REQUEST_SHARE_WEIGHT = 0.5;

/** Appended to the affinity key for decode, so P and D spread independently of each other. */
export const DECODE_KEY_DISCRIMINATOR = ":decode";

/** The key a role ranks with: the request key for prefill, the key + discriminator for decode. */
export function roleKey(key: string | null, role: Role): string | null {
  if (key === null) return null;
  return role === "decode" ? key + DECODE_KEY_DISCRIMINATOR : key;
}

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

/** The decision with its mode, reason and the request's size for the nodes picked. */
function decided(
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

// ---------------------------------------------------------------------------------------------
// Conditional disaggregation: D first

/**
 * `policy.disaggregation: "conditional"` (SPEC 8): D is picked first by the decode policy (with
 * the KV guard); the prompt's tokens D is predicted not to hold decide whether D prefills it
 * alone (local-prefill.ts); otherwise a P is picked by the prefill policy, its group relative to
 * the chosen D (prefer: P in D's group within the bonus; strict: D's ranking is walked to the
 * first D whose group has a P). A D that would prefill the request anyway is no P for it when
 * another exists (`both` nodes: one pool serving either way).
 */
function selectDecodeFirst(input: SelectionInput, cursors: Decision["cursors"], rankDecode: () => Result<Ranked, SelectionError>): Result<Decision, SelectionError> {
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

// ---------------------------------------------------------------------------------------------
// Predicted disaggregation: every pair and every local option, by predicted TTFT

const DEFAULT_RATES = profileRates(DEFAULT_PROFILE);
const round1 = (x: number): number => Math.round(x * 10) / 10;

/**
 * `policy.disaggregation: "predicted"` (SPEC 9): both pools are ranked by their policies (bounds,
 * the KV guard and stickiness as ever); every P and D they would take — under their bounds, not
 * busy — is an option, paired with every other (inside one group under pdGroup strict; `prefer`
 * is not applied), and every such D that may prefill alone is a local option too. The choice is
 * select-predicted.ts's; the candidates carry each node's rates and predicted TTFT.
 */
function selectPredicted(input: SelectionInput, cursors: Decision["cursors"], rankDecode: () => Result<Ranked, SelectionError>): Result<Decision, SelectionError> {
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
    [r.decision.id, ...r.preferred.filter((id) => id !== r.decision.id)].map((id) => nodeById(pool.nodes, id)).filter((n): n is CandidateNode => n !== undefined);
  const answer = choosePredicted({
    prefills: optionsOf(prefill, prefillPool).map((n) => ({ id: n.id, group: n.group, node: predictedNode(n), size: sizeOn(n, "prefill") })),
    decodes: optionsOf(decode.value, decodePool).map((n) => ({
      id: n.id,
      group: n.group,
      node: predictedNode(n),
      size: sizeOn(n, "decode"),
      localPrefill: n.localPrefill === true,
      kvUsage: n.signals?.kvUsage ?? null,
      kvCapacityTokens: n.signals?.kvCapacityTokens ?? null,
    })),
    sameGroup: input.policy.pdGroup === "strict",
    kvBusy: input.guard?.kvBusy ?? 1,
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
function predictedNode(n: CandidateNode): PredictedNode {
  return {
    rates: n.rates ?? DEFAULT_RATES,
    prefillTokens: n.prefillTokens ?? 0,
    prefillRequests: n.prefillRequests ?? 0,
    waiting: n.signals?.queue ?? null,
    decoding: n.decoding ?? 0,
  };
}

/** The prediction took another node of the policy's ranking: the policy's pick becomes its first fallback. */
function movedTo(d: RoleDecision, id: string): RoleDecision {
  return { ...d, id, rule: "predicted", fallbacks: [d.id, ...d.fallbacks].filter((f) => f !== id), failOpen: false };
}

/** A candidate as /v1/route shows it under prediction: its learned rates and the best option through it. */
function withPrediction(c: ScoredCandidate, n: CandidateNode | undefined, f: NodeFigures | undefined): ScoredCandidate {
  const rates = n?.rates ?? DEFAULT_RATES;
  const out: ScoredCandidate = {
    ...c,
    prefillMsPerToken: Math.round(rates.prefillMsPerToken * 1e4) / 1e4,
    decodeStepMs: round1(rates.decodeStepMs),
    decodeMsPerSeq: Math.round(rates.decodeMsPerSeq * 100) / 100,
    transferMsPerGB: round1((rates.transferMsPerToken * 1e9) / KV_BYTES_PER_TOKEN),
  };
  if (f) {
    out.predictedTtftMs = round1(f.predictedTtftMs);
    if (f.localTtftMs !== undefined) out.localTtftMs = f.localTtftMs === null ? null : round1(f.localTtftMs);
    if (f.decodeHarmMs !== undefined) out.decodeHarmMs = round1(f.decodeHarmMs);
  }
  return out;
}

/** pdGroup strict found no group with both roles: the groups tried for `other`, and those where `role` may take work. */
function noneInGroup(role: Role, other: Role, tried: string[], pool: CandidateNode[]): Result<never, SelectionError> {
  const list = (groups: string[]) => groups.join(", ") || "none";
  const available = [...new Set(pool.filter(isAvailable).map((n) => n.group))];
  return fail({
    kind: "no_decode_in_group",
    message: `pdGroup strict: no ${role} node may take work in a group of the ${other} candidates (tried: ${list(tried)}; with an available ${role} node: ${list(available)})`,
  });
}

/**
 * pdGroup strict's pick `id` further down `first`'s ranking, past the nodes `passed`: those are
 * skipped for their group, and failover stays in the pick's group.
 */
function walkedTo(first: RoleDecision, passed: string[], id: string, pool: Pool): Pick<RoleDecision, "id" | "candidates" | "fallbacks"> {
  const skipped = new Set(passed);
  const inGroup = inGroupOf(pool, nodeById(pool.nodes, id)?.group);
  return {
    id,
    candidates: first.candidates.map((c) => (skipped.has(c.id) ? { ...c, skipped: "group" } : c.id === id ? withoutSkip(c) : c)),
    fallbacks: [first.id, ...first.fallbacks].filter((f) => f !== id && inGroup(f)),
  };
}

/** A local prefill fails over to any D when a P/D path exists (it goes P then D), else only to decode nodes that may prefill alone too. */
function withPdFallbacks(d: RoleDecision, pool: Pool, pd: boolean): RoleDecision {
  return pd ? d : { ...d, fallbacks: d.fallbacks.filter((id) => nodeById(pool.nodes, id)?.localPrefill === true) };
}

/** The prefill pool for a request whose D is `decodeId`: without that node while another may take work. */
function prefillPoolFor(input: SelectionInput, decodeId: string): Pool {
  const pool = poolOf(input, "prefill");
  const others = pool.nodes.filter((n) => n.id !== decodeId);
  return others.some(isAvailable) ? { ...pool, nodes: others } : pool;
}

// ---------------------------------------------------------------------------------------------
// One role

interface Pool {
  role: Role;
  policy: PolicyName;
  nodes: CandidateNode[];
  key: string | null;
  cursor: number;
  sticky: string | undefined;
  pinned: boolean;
  matches: Record<string, number>;
  blockCount: number;
  loadFactor: number;
  loadSlack: number;
  cacheLoadFactor: number;
  shareFactor: number;
  /** the decode KV guard; null for prefill and for requests it does not apply to */
  guard: GuardSettings | null;
  /** the prompt's characters (0: unknown) and the prefix blocks' size: each candidate's uncached tokens */
  promptChars: number;
  blockChars: number;
  /** this request's share of work in the unit `recent` counts (tokens): the "+1" of the share bound */
  requestWork: number;
}

function poolOf(input: SelectionInput, role: Role): Pool {
  return {
    role,
    policy: input.policy[role],
    nodes: input[role],
    key: roleKey(input.key, role),
    cursor: input.cursors[role],
    sticky: input.sticky?.[role],
    pinned: input.pinned === true,
    matches: input.prefixMatches[role],
    blockCount: input.prefixBlockCount,
    loadFactor: input.policy.loadFactor,
    loadSlack: input.policy.loadSlack,
    cacheLoadFactor: input.policy.cacheAware.loadFactor,
    shareFactor: input.policy.cacheAware.shareFactor,
    guard: role === "decode" ? (input.guard ?? null) : null,
    promptChars: input.promptChars ?? 0,
    blockChars: input.policy.cacheAware.blockChars,
    requestWork: Math.max(1, promptTokensOf(input.promptChars ?? 0)),
  };
}

interface Ranked {
  kind: "ok";
  decision: RoleDecision;
  /** available, in-scope nodes under their bound, in the policy's order (the chosen one included) */
  preferred: string[];
  usedRoundRobin: boolean;
  /** the load each node was weighed with (in-flight requests weighted by their tokens, plus the KV barrier) */
  effective: Map<string, number>;
}

/**
 * `empty`: the pool has no node; `none_in_group`: the group filter left nothing usable; `busy`:
 * some node may take work but every one of them is busy (decode KV guard).
 */
type RankOutcome = Ranked | { kind: "empty" } | { kind: "none_in_group" } | { kind: "busy"; candidates: ScoredCandidate[] };

const isAvailable = (n: CandidateNode): boolean => n.healthy && !n.drain;
const weightOf = (n: CandidateNode): number => (n.weight > 0 ? n.weight : 1);
const round3 = (x: number): number => Math.round(x * 1000) / 1000;

/** The guard's figures on a decode candidate, as /v1/route shows them. */
function withSignals(c: ScoredCandidate, n: CandidateNode, busy: boolean, barrier: number): void {
  const s = n.signals ?? null;
  c.kvUsage = s?.kvUsage ?? null;
  c.queue = s?.queue ?? null;
  c.signalsAgeMs = s ? s.ageMs : null;
  c.busy = busy;
  // infinite only at a full cache, which is always busy
  if (Number.isFinite(barrier)) c.kvBarrier = round3(barrier);
}

/**
 * Ranks one role's pool by its policy and picks a node. `group` restricts the pick to one group
 * (pdGroup strict); out-of-group nodes are still listed, marked skipped "group".
 */
function rankRole(pool: Pool, group?: string): RankOutcome {
  const { nodes } = pool;
  if (nodes.length === 0) return { kind: "empty" };
  const inScope = (n: CandidateNode): boolean => group === undefined || n.group === group;
  const scope = nodes.filter(inScope);
  const guard = pool.guard;
  // busy for this request: inside the window a 503/429 asked for, or (decode) a node this request's prompt would take to kvBusy
  const busy = (n: CandidateNode): boolean => n.busy === true || (guard !== null && isBusyFor(n, guard, promptTokensOf(pool.promptChars, n.charsPerToken)));
  /** may take new work: available and not busy */
  const open = (n: CandidateNode): boolean => isAvailable(n) && !busy(n);
  const eligible = (n: CandidateNode): boolean => open(n) && inScope(n);
  // KV pressure counts as extra in-flight requests wherever load is weighed (kv-guard.ts), and
  // in-flight requests count by their tokens (work.ts): over the nodes that may take work the
  // weighted counts sum to the plain count, so the bounds below keep their meaning
  const barrier = (n: CandidateNode): number => (guard === null ? 0 : kvBarrier(n));
  const weighted = new Map<string, number>();
  const weights = workWeightedLoads(nodes, nodes.map(open));
  for (const [i, n] of nodes.entries()) weighted.set(n.id, weights[i] ?? Math.max(0, n.load));
  const loadOf = (n: CandidateNode): number => (weighted.get(n.id) ?? Math.max(0, n.load)) + barrier(n);
  if (scope.length === 0) return { kind: "none_in_group" };

  const usesKey = pool.policy === "affinity" || pool.policy === "cache_aware";
  const policy: PolicyName = usesKey && pool.key === null ? "round_robin" : pool.policy;
  const bounded = policy === "affinity" || policy === "cache_aware";

  // Load totals over the nodes that may take new work (all groups: load is a pool-wide picture).
  // Over exactly that set the bounds sum to more than its load, so some node is under its bound.
  let totalLoad = 0;
  let totalWeight = 0;
  let totalRecent = 0;
  let totalRequests = 0;
  for (const n of nodes) {
    if (!open(n)) continue;
    totalLoad += loadOf(n);
    totalWeight += n.weight;
    totalRecent += Math.max(0, n.recent ?? 0);
    totalRequests += Math.max(0, n.recentRequests ?? 0);
  }
  // The recent share in work: the tokens a node was given lately, plus for each request half the
  // pool's mean tokens a request — a request costs its node more than its prefill (it holds KV and
  // decodes), so a node given many cheap warm turns is not taken for idle. One measure, summed
  // over the same nodes as the totals, so the share bounds below still sum past the total.
  const meanWork = totalRequests > 0 ? (REQUEST_SHARE_WEIGHT * totalRecent) / totalRequests : 0;
  const recentOf = (n: CandidateNode): number => Math.max(0, n.recent ?? 0) + meanWork * Math.max(0, n.recentRequests ?? 0);
  const totalShare = totalRecent + meanWork * totalRequests;
  /** the recent share per unit of weight (cache_aware's and least_load's tie-break) */
  const shareOf = (n: CandidateNode): number => recentOf(n) / weightOf(n);
  const cacheAware = policy === "cache_aware";
  const loadFactor = cacheAware ? pool.cacheLoadFactor : pool.loadFactor;
  // A node outside that set (a draining sticky node) is measured as if it were one more member.
  // The slack applies to cache_aware's in-flight bound too: moving a conversation off its cache
  // on a lightly loaded cluster costs a whole prefill for nothing.
  const boundOf = (n: CandidateNode): number =>
    open(n)
      ? loadBound(n.weight, totalWeight, totalLoad, loadFactor, pool.loadSlack)
      : loadBound(n.weight, totalWeight + n.weight, totalLoad + loadOf(n), loadFactor, pool.loadSlack);
  // cache_aware's share bound: the same construction over the work recently routed (tokens), so
  // the bounds again sum to more than the total and some node is always under its own. Every node
  // may also be one such request over its share (the request's own size, like loadSlack for
  // in-flight load): on a lightly loaded cluster one long cold prompt would otherwise put its node
  // over the share, and the conversation's next turn would leave the node holding its cache.
  const slack = pool.requestWork + meanWork;
  const shareBoundOf = (n: CandidateNode): number => {
    const weight = open(n) ? totalWeight : totalWeight + n.weight;
    const recent = open(n) ? totalShare : totalShare + recentOf(n);
    return weight > 0 ? (pool.shareFactor * (recent + slack) * n.weight) / weight + slack : Infinity;
  };
  const underShare = (n: CandidateNode): boolean => !cacheAware || recentOf(n) < shareBoundOf(n);
  const underOwnBound = (n: CandidateNode): boolean => !bounded || (loadOf(n) < boundOf(n) && underShare(n));

  const rendezvous = new Map<string, number>();
  if (pool.key !== null && policy !== "round_robin") {
    for (const n of nodes) rendezvous.set(n.id, rendezvousScore(pool.key, n));
  }
  const byRendezvous = (a: CandidateNode, b: CandidateNode): number => (rendezvous.get(b.id) ?? 0) - (rendezvous.get(a.id) ?? 0) || compareIds(a.id, b.id);

  // Session stickiness: the conversation's previous node keeps it, even while draining, unless busy.
  // A pinned request (its node holds state it needs) keeps the node whatever the policy, bound and KV.
  // Under cache_aware it keeps it only among the nodes holding the longest prefix: a key shared by
  // many conversations (a common system prompt in a completions prompt's first blocks) must not
  // pull them all onto the node that served the last of them, away from the nodes holding their own.
  const matchedOf = (n: CandidateNode): number => Math.max(0, Math.min(pool.matches[n.id] ?? 0, pool.blockCount));
  const longestMatch = policy === "cache_aware" ? Math.max(0, ...scope.filter((n) => open(n)).map(matchedOf)) : 0;
  if ((usesKey || pool.pinned) && pool.sticky !== undefined) {
    const sticky = nodes.find((n) => n.id === pool.sticky);
    const holdsLongest = sticky !== undefined && (policy !== "cache_aware" || matchedOf(sticky) >= longestMatch);
    if (sticky?.healthy && inScope(sticky) && (pool.pinned || (!busy(sticky) && underOwnBound(sticky) && holdsLongest))) {
      const order = policyOrder(pool, policy, nodes, inScope, byRendezvous, loadOf, shareOf);
      return finish(order, sticky, "sticky", false);
    }
  }

  const ready = scope.filter(isAvailable);
  if (ready.length === 0) {
    // Walk on to another group (strict) while some node elsewhere may take work.
    if (group !== undefined && nodes.some(isAvailable)) return { kind: "none_in_group" };
    return failOpen();
  }
  const free = ready.filter((n) => !busy(n));
  if (free.length === 0 && guard !== null) {
    // Every node that could serve is busy: the request waits at the edge (admission queue).
    // Without a queue (prefill, one hop) the busy ones are taken, least loaded first.
    const order = policyOrder(pool, policy, nodes, inScope, byRendezvous, loadOf, shareOf);
    return { kind: "busy", candidates: finish(order, null, policy, false).decision.candidates };
  }

  const order = policyOrder(pool, policy, nodes, inScope, byRendezvous, loadOf, shareOf);
  let chosen = order.nodes.find((n) => eligible(n) && underOwnBound(n));
  let rule: DecisionRule = policy;
  if (chosen === undefined) {
    // Every candidate is at its bound: possible only inside one group (strict) or with
    // loadFactor < 1. Take the least loaded rather than refuse.
    chosen = [...(free[0] ? free : ready)].sort((a, b) => loadOf(a) / weightOf(a) - loadOf(b) / weightOf(b))[0] as CandidateNode;
    if (policy === "affinity") rule = "affinity_bounded_skip";
  } else if (policy === "affinity") {
    const before = order.nodes.slice(0, order.nodes.indexOf(chosen));
    if (before.some((n) => eligible(n) && !underOwnBound(n))) rule = "affinity_bounded_skip";
  }
  return finish(order, chosen, rule, policy === "round_robin");

  function finish(order: PolicyOrder, pick: CandidateNode | null, why: DecisionRule, usedRoundRobin: boolean): Ranked {
    const ordered = order.nodes;
    const candidates = ordered.map((n): ScoredCandidate => {
      const c = candidate(n);
      if (bounded) c.bound = boundOf(n);
      withRendezvous(c);
      const terms = order.terms?.get(n.id);
      if (terms) {
        c.matchedBlocks = terms.matched;
        c.score = terms.score;
        c.recent = round3(recentOf(n));
        c.shareBound = round3(shareBoundOf(n));
        if (n.recentRequests !== undefined) c.recentRequests = round3(n.recentRequests);
      }
      if (n !== pick) {
        const skipped = skipReason(n);
        if (skipped) c.skipped = skipped;
      }
      return c;
    });
    const preferred = ordered.filter((n) => eligible(n) && underOwnBound(n)).map((n) => n.id);
    const overBound = ordered.filter((n) => eligible(n) && !underOwnBound(n)).map((n) => n.id);
    // a busy node is a last resort for a failover: better than an error once the request is under way
    const busyOnes = ordered.filter((n) => isAvailable(n) && inScope(n) && busy(n)).map((n) => n.id);
    const fallbacks = [...preferred, ...overBound, ...busyOnes].filter((id) => id !== pick?.id);
    return ranked({ id: pick?.id ?? "", rule: why, candidates, fallbacks, failOpen: false }, preferred, usedRoundRobin);
  }

  function ranked(decision: RoleDecision, preferred: string[], usedRoundRobin: boolean): Ranked {
    return { kind: "ok", decision, preferred, usedRoundRobin, effective: new Map(nodes.map((n) => [n.id, loadOf(n)])) };
  }

  /** A node as /v1/route shows it: its state, the guard's figures, in-flight tokens, the load weighed, and what it lacks of this prompt. */
  function candidate(n: CandidateNode): ScoredCandidate {
    const c: ScoredCandidate = { id: n.id, load: n.load, healthy: n.healthy, drain: n.drain, group: n.group };
    if (guard !== null) withSignals(c, n, busy(n), barrier(n));
    else if (n.busy) c.busy = true;
    if (n.work !== undefined) c.loadTokens = n.work;
    const effective = loadOf(n);
    if (Number.isFinite(effective)) c.effectiveLoad = round3(effective);
    if (pool.promptChars > 0) c.uncachedTokens = uncachedTokensOf(pool.promptChars, pool.matches[n.id] ?? 0, pool.blockChars, n.charsPerToken);
    return c;
  }

  function withRendezvous(c: ScoredCandidate): void {
    const rv = rendezvous.get(c.id);
    if (rv !== undefined) c.rendezvous = rv;
  }

  function skipReason(n: CandidateNode): ScoredCandidate["skipped"] {
    if (!n.healthy) return "unhealthy";
    if (!inScope(n)) return "group";
    if (n.drain) return "draining";
    if (busy(n)) return "busy";
    if (bounded && loadOf(n) >= boundOf(n)) return "over_bound";
    if (!underShare(n)) return "over_share";
    return undefined;
  }

  /**
   * No node in scope may take work: rather than refusing, take the one that failed least recently
   * (healthy draining nodes first, when all that is left is draining).
   */
  function failOpen(): Ranked {
    const healthy = scope.filter((n) => n.healthy);
    const pick = healthy.length > 0 ? healthy : scope;
    const byFailure = [...pick].sort((a, b) => a.lastFailureAt - b.lastFailureAt || byRendezvous(a, b));
    const rest = nodes.filter((n) => !pick.includes(n)).sort((a, b) => compareIds(a.id, b.id));
    const chosenNode = byFailure[0] as CandidateNode;
    const candidates = [...byFailure, ...rest].map((n): ScoredCandidate => {
      const c = candidate(n);
      withRendezvous(c);
      if (n !== chosenNode) c.skipped = !inScope(n) ? "group" : !n.healthy ? "unhealthy" : "draining";
      return c;
    });
    return ranked({ id: chosenNode.id, rule: "fail_open", candidates, fallbacks: byFailure.slice(1).map((n) => n.id), failOpen: true }, [], false);
  }
}

interface PolicyOrder {
  nodes: CandidateNode[];
  terms?: Map<string, { matched: number; score: number }>;
}

/** Every node of the pool in the policy's order, best first. `loadOf`: in-flight plus the KV barrier. */
function policyOrder(
  pool: Pool,
  policy: PolicyName,
  nodes: CandidateNode[],
  inScope: (n: CandidateNode) => boolean,
  byRendezvous: (a: CandidateNode, b: CandidateNode) => number,
  loadOf: (n: CandidateNode) => number,
  shareOf: (n: CandidateNode) => number,
): PolicyOrder {
  switch (policy) {
    case "round_robin": {
      // The cycle is the available in-scope nodes by id; the cursor picks where it starts.
      const byId = [...nodes].sort((a, b) => compareIds(a.id, b.id));
      const cycle = byId.filter((n) => isAvailable(n) && inScope(n));
      const rest = byId.filter((n) => !cycle.includes(n));
      // the cursor only counts up from 0, one a request
      const start = cycle.length === 0 ? 0 : pool.cursor % cycle.length;
      return { nodes: [...cycle.slice(start), ...cycle.slice(0, start), ...rest] };
    }
    case "affinity":
      return { nodes: [...nodes].sort(byRendezvous) };
    case "least_load":
      // Ties (idle nodes) go to the smallest recent share first: a rendezvous order alone would
      // hand every tie to the same nodes whenever requests share a key (a common system prompt).
      return { nodes: [...nodes].sort((a, b) => loadOf(a) / weightOf(a) - loadOf(b) / weightOf(b) || shareOf(a) - shareOf(b) || byRendezvous(a, b)) };
    case "cache_aware": {
      // Longest cached prefix first: a block found is a block not prefilled again. Load enters
      // as hard limits (in-flight and recent-share bounds, applied by the caller), not as a
      // discount on the match, which would trade hits for a balance the bounds already keep.
      // Equal matches (nothing held, or only a system prompt every node holds) go to the node
      // with the smallest recent share, then rendezvous order on the conversation key.
      const terms = new Map<string, { matched: number; score: number }>();
      for (const n of nodes) {
        const matched = Math.max(0, Math.min(pool.matches[n.id] ?? 0, pool.blockCount));
        terms.set(n.id, { matched, score: pool.blockCount > 0 ? matched / pool.blockCount : 0 });
      }
      const matchedOf = (n: CandidateNode): number => terms.get(n.id)?.matched ?? 0;
      return {
        nodes: [...nodes].sort((a, b) => matchedOf(b) - matchedOf(a) || shareOf(a) - shareOf(b) || byRendezvous(a, b)),
        terms,
      };
    }
  }
}

// ---------------------------------------------------------------------------------------------
// pdGroup

/**
 * prefer: take the best-ranked node of the partner's group (g) over the best node overall (b) —
 * D in P's group, or under conditional disaggregation P in D's group — when its load per unit of
 * weight is within the bonus of b's: g.load / g.weight <= b.load / b.weight * (1 + bonus) (SPEC 5).
 * Load is the one the policy weighed (in-flight requests weighted by their tokens, plus the KV
 * barrier for D), so a D near a full cache is not preferred for its group; a busy one never is
 * (`preferred` holds only nodes that may take work). Dividing by weight compares nodes of
 * different sizes fairly, and an idle cluster (0 <= 0) always stays in the group whatever the
 * weights. A sticky or fail-open pick stays.
 */
function preferGroup(ranked: Ranked, pool: Pool, group: string, bonus: number): RoleDecision {
  const decision = ranked.decision;
  if (decision.rule === "sticky" || decision.failOpen) return decision;
  const best = nodeById(pool.nodes, decision.id);
  if (!best || best.group === group) return decision;
  const sameGroup = inGroupOf(pool, group);
  const inGroupId = ranked.preferred.find(sameGroup);
  const inGroup = inGroupId === undefined ? undefined : nodeById(pool.nodes, inGroupId);
  if (!inGroup) return decision;
  const perWeight = (n: CandidateNode): number => (ranked.effective.get(n.id) ?? n.load) / weightOf(n);
  const within = perWeight(inGroup) <= perWeight(best) * (1 + bonus);
  if (!within) return decision;

  const order = [decision.id, ...decision.fallbacks].filter((id) => id !== inGroup.id);
  const pickedAt = decision.candidates.findIndex((c) => c.id === inGroup.id);
  return {
    id: inGroup.id,
    rule: "pdgroup_prefer",
    candidates: decision.candidates.map((c, i) => (i < pickedAt && c.skipped === undefined && c.group !== group ? { ...c, skipped: "group" } : c)),
    fallbacks: [...order.filter(sameGroup), ...order.filter((id) => !sameGroup(id))],
    failOpen: false,
  };
}

interface StrictOutcome {
  prefill: RoleDecision;
  decode: RoleDecision;
  decodeUsedRoundRobin: boolean;
}

/**
 * strict: walk P's ranking (its pick, then its fallbacks) to the first P whose group has a D that
 * may take the request, and pick that D by the decode policy within the group. Both roles'
 * fallbacks stay inside the group, so a failover never crosses groups either.
 */
function strictGroup(prefill: Ranked, prefillPool: Pool, decodePool: Pool): Result<StrictOutcome, SelectionError> {
  const walk = [prefill.decision.id, ...prefill.decision.fallbacks];
  const tried: string[] = [];
  let busy: ScoredCandidate[] | null = null;
  for (const [index, pid] of walk.entries()) {
    const group = nodeById(prefillPool.nodes, pid)?.group;
    if (group === undefined || tried.includes(group)) continue;
    tried.push(group);
    const decode = rankRole(decodePool, group);
    if (decode.kind === "busy") busy ??= decode.candidates;
    if (decode.kind !== "ok") continue;

    const p = prefill.decision;
    const prefillDecision: RoleDecision = { ...walkedTo(p, walk.slice(0, index), pid, prefillPool), rule: index === 0 ? p.rule : "pdgroup_strict", failOpen: p.failOpen };
    const d = decode.decision;
    const decodeDecision: RoleDecision = d.rule === "sticky" || d.rule === "fail_open" ? d : { ...d, rule: "pdgroup_strict" };
    return {
      ok: true,
      value: { prefill: prefillDecision, decode: decodeDecision, decodeUsedRoundRobin: decode.usedRoundRobin },
    };
  }

  // a group had decode nodes that may take work, all busy: the request waits rather than fails
  if (busy) return fail({ kind: "decode_busy", candidates: busy });
  return noneInGroup("decode", "prefill", tried, decodePool.nodes);
}

function withoutSkip(c: ScoredCandidate): ScoredCandidate {
  if (c.skipped === undefined) return c;
  const { skipped: _skipped, ...rest } = c;
  return rest;
}

/** Whether a node of the pool is in `group`. */
function inGroupOf(pool: Pool, group: string | undefined): (id: string) => boolean {
  return (id) => nodeById(pool.nodes, id)?.group === group;
}

function nodeById(nodes: readonly CandidateNode[], id: string): CandidateNode | undefined {
  return nodes.find((n) => n.id === id);
}

function fail<T>(error: SelectionError): Result<T, SelectionError> {
  return { ok: false, error };
}
