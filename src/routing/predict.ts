// Predicted time to first token of one way to serve a request (issue 23 item 2, SPEC 9), pure.
//
// TTFT of P then D: the prefill work already queued on P (its running prefill tokens, plus what
// its engine reports waiting beyond them) and this request's uncached tokens, at P's learned rate
// with attention over the context; then the transfer of what D lacks; then D's first step, which
// also waits for the prefill work queued on D (vLLM's scheduler is FCFS, so a request whose KV
// arrived still queues behind D's own prefills: vllm/v1/core/sched/scheduler.py). A local prefill
// on D: D's queue and its own prefill, then a step; it also lengthens the steps of every sequence
// decoding on D by its prefill (vLLM mixes prefill chunks into the decode batch: chunked
// prefill), which is counted as decode harm; and D needs KV room for the whole prompt.
//
// The same analytic form llm-d made its default estimate (prefill tokens in flight over a
// calibrated throughput), with the rates learned per node by the object (state/node-rates.ts).

/** A node's learned rates (state/node-rates.ts). */
export interface NodeRates {
  /** ms a prefill token at context 0 (prefillContextFactor gives it at a context) */
  prefillMsPerToken: number;
  /** ms a decode step of one sequence, and what each further sequence in the batch adds */
  decodeStepMs: number;
  decodeMsPerSeq: number;
  /** ms to move one token's KV to this node (as D) */
  transferMsPerToken: number;
  /**
   * ms of D's first byte after P's answer that does not grow with the tokens it lacks: its own
   * request, the transfer's setup, its scheduling (one decode step in a profile; learned with the
   * per-token rate)
   */
  handoffMs: number;
  /**
   * tokens a request decodes, the mean over the cluster's recent streams (the same on every node;
   * a profile's prior 256; absent or 0: decode load is not priced)
   */
  decodeTokens?: number;
}

/**
 * Context at which a prefill token costs twice what it costs at 0: attention reads every earlier
 * token. From the H20 figures: 2,048 uncached tokens take ~430 ms of a step at 10k
 * context and ~860 ms at 30k, so k(1 + 10k/C) = 0.21 ms and k(1 + 30k/C) = 0.42 ms: C = 10k.
 */
export const ATTENTION_CONTEXT_TOKENS = 10_000;

/**
 * KV bytes a token, to show the transfer rate per GB and read `profile.transferGBPerS`: a
 * Llama-3-8B-sized model (32 layers x 8 KV heads x 128 dims x K and V x 2 bytes = 128 KiB).
 */
export const KV_BYTES_PER_TOKEN = 131_072;

/** How much a token at mean context `ctx` costs over one at context 0. */
export const prefillContextFactor = (ctx: number): number => 1 + Math.max(0, ctx) / ATTENTION_CONTEXT_TOKENS;

/** `profile` of the document (per pool) and of a node (SPEC 9): the prior of the learned rates. */
export interface RateProfile {
  prefillTokensPerS: number;
  decodeStepMs: number;
  transferGBPerS: number;
}

export const DEFAULT_PROFILE: RateProfile = { prefillTokensPerS: 10_000, decodeStepMs: 30, transferGBPerS: 10 };

/** A profile's figures as rates. */
export const profileRates = (p: RateProfile): NodeRates => ({
  prefillMsPerToken: 1000 / p.prefillTokensPerS,
  decodeStepMs: p.decodeStepMs,
  decodeMsPerSeq: 0,
  transferMsPerToken: (KV_BYTES_PER_TOKEN / (p.transferGBPerS * 1e9)) * 1000,
  // a decode leg meets D's step loop twice besides its first step (state/node-rates.ts transferLine)
  handoffMs: p.decodeStepMs,
  decodeTokens: 256,
});

/** One node as the prediction reads it. */
export interface PredictedNode {
  rates: NodeRates;
  /** prefill tokens running on the node (router leases) and the requests they belong to */
  prefillTokens: number;
  prefillRequests: number;
  /**
   * their cost in tokens at context 0, each at its own context (an 80k-token prompt queued costs
   * ~5x its tokens, a short follow-up turn little more than its own); absent: their tokens at this
   * request's context
   */
  prefillCost?: number;
  /** the engine's waiting requests (projected), null without a fresh poll */
  waiting: number | null;
  /**
   * the node serves only as D: a waiting request the router did not send it as a prefill is a
   * decode leg waiting for its KV (vLLM's RequestStatus.WAITING_FOR_REMOTE_KVS, vllm/v1/core/sched/scheduler.py) — a pull ahead of this one on
   * D's link, not a prompt to prefill; absent or false: each is taken as a prompt's prefill
   */
  decodeOnly?: boolean;
  /** sequences decoding on the node */
  decoding: number;
  /**
   * the prompt tokens of those sequences (the node's decode leases): a waiting request the router
   * did not send as a prefill is one of them in the engine's queue — a sequence preempted for KV
   * (vLLM puts it back at the head of the waiting queue to recompute: vllm/v1/core/sched/scheduler.py
   * `_preempt_request`), or a decode leg waiting for its KV — so it is sized as their mean;
   * absent, or nothing decoding: as this request's prompt
   */
  decodingTokens?: number;
}

/** What one request is to a node: its prompt and the part the node lacks. */
export interface RequestSize {
  promptTokens: number;
  uncachedTokens: number;
}

/** Waiting requests on the node that the router did not send it as prefills. */
const unknownWaiting = (n: PredictedNode): number => (n.waiting === null ? 0 : Math.max(0, n.waiting - n.prefillRequests));

/**
 * Tokens of one waiting request the router did not send: the mean prompt of the sequences the node
 * holds as D, else this request's prompt. Taking every one as this prompt made a KV-full node with
 * a few preempted sequences look hundreds of thousands of tokens deep to a long follow-up turn
 * (docs/predicted.md: measured, it moved the agentic runs little; none of them preempted).
 */
export function waitingSizeOf(n: PredictedNode, size: RequestSize): number {
  const decoding = Math.max(0, n.decoding);
  return decoding > 0 && n.decodingTokens !== undefined ? Math.max(0, n.decodingTokens) / decoding : Math.max(0, size.promptTokens);
}

/** Tokens of the waiting requests the node's engine reports beyond the router's prefills (waitingSizeOf each). */
const unknownWaitingTokens = (n: PredictedNode, size: RequestSize): number => unknownWaiting(n) * waitingSizeOf(n, size);

/** Prefill tokens queued on the node before this request: its running prefills, and waiting requests it did not send (none on a decode-only node). */
export function queuedTokens(n: PredictedNode, size: RequestSize): number {
  return Math.max(0, n.prefillTokens) + (n.decodeOnly ? 0 : unknownWaitingTokens(n, size));
}

/**
 * ms of the node's queue before this request: its running prefills at their own context (their
 * cost), waiting requests it did not send at this request's, and on a decode-only node the pulls
 * of the legs waiting for their KV.
 */
function queueMsOf(n: PredictedNode, size: RequestSize, contextFactor: number): number {
  const running = Math.max(0, n.prefillCost ?? n.prefillTokens * contextFactor);
  const waiting = unknownWaitingTokens(n, size);
  // a decode-only node's waiting requests are legs pulling their KV, not prompts to prefill
  return n.decodeOnly ? running * n.rates.prefillMsPerToken + waiting * n.rates.transferMsPerToken : (running + waiting * contextFactor) * n.rates.prefillMsPerToken;
}

/** ms of this request's own prefill on a node lacking `uncached` of its `prompt` tokens. */
export function ownPrefillMs(rates: NodeRates, size: RequestSize): number {
  const uncached = Math.max(0, Math.min(size.uncachedTokens, size.promptTokens || size.uncachedTokens));
  const cached = Math.max(0, size.promptTokens - uncached);
  return uncached * rates.prefillMsPerToken * prefillContextFactor(cached + uncached / 2);
}

/** ms until the node has prefilled this request: what is queued there, then its own. */
export function prefillDoneMs(n: PredictedNode, size: RequestSize): number {
  const cached = Math.max(0, size.promptTokens - size.uncachedTokens);
  // waiting requests the router did not send at this request's context: it knows nothing of theirs
  return queueMsOf(n, size, prefillContextFactor(cached)) + ownPrefillMs(n.rates, size);
}

/** Predicted TTFT of P then D: P prefills, D pulls what it lacks, D's queue drains meanwhile, D steps once. */
export function remoteTtftMs(p: PredictedNode, onP: RequestSize, d: PredictedNode, onD: RequestSize): number {
  return remoteAfterPrefillMs(prefillDoneMs(p, onP), decodeSide(d, onD));
}

/** D's next step with this request joining the sequences decoding there. */
export const stepMsOf = (d: PredictedNode): number => d.rates.decodeStepMs + d.rates.decodeMsPerSeq * Math.max(0, d.decoding);

/** D's part of a pair, which does not depend on P: the hand-off and transfer of what it lacks, its queue, its step. */
export interface DecodeSide {
  transferMs: number;
  queueMs: number;
  stepMs: number;
}

export function decodeSide(d: PredictedNode, onD: RequestSize): DecodeSide {
  return {
    transferMs: d.rates.handoffMs + Math.max(0, onD.uncachedTokens) * d.rates.transferMsPerToken,
    queueMs: queueMsOf(d, onD, prefillContextFactor(Math.max(0, onD.promptTokens - onD.uncachedTokens))),
    stepMs: stepMsOf(d),
  };
}

/** A pair's TTFT from P's prefill time and D's part. */
export const remoteAfterPrefillMs = (prefillMs: number, d: DecodeSide): number => Math.max(prefillMs + d.transferMs, d.queueMs) + d.stepMs;

export interface LocalPrediction {
  ttftMs: number;
  /** ms added to the decoding sequences' steps, summed over them: its own prefill x sequences decoding */
  harmMs: number;
}

/**
 * The decode harm of prefilling this request on a node: its prefill x the sequences decoding there.
 * Whoever prefills pays it — D prefilling alone, and a P that also decodes (a `both` node); a
 * prefill-only P decodes nothing and pays 0.
 */
export const prefillHarmMs = (n: PredictedNode, size: RequestSize): number => ownPrefillMs(n.rates, size) * Math.max(0, n.decoding);

/**
 * What decoding this request on D costs the cluster in steps its batch lengthens (ms summed over
 * sequences): each of its steps is longer by ms a sequence x the sequences decoding there, and it
 * adds ms a sequence to each of theirs, over the tokens a request decodes. Only the difference
 * between two Ds counts (choosePredicted takes it over the least loaded): without it nothing priced
 * the steps a new sequence lengthens, and a warm D's batch grew unseen. The step of one sequence is
 * left out: it is the pool's alike, and learned per node its noise times hundreds of tokens chose
 * the D (one-off build, 2026-12-02); for the same reason select-predicted.ts prices the load at the
 * candidate Ds' mean ms a sequence (2026-12-03).
 */
export const decodeLoadMs = (d: PredictedNode, msPerSeq = d.rates.decodeMsPerSeq): number => (d.rates.decodeTokens ?? 0) * 2 * msPerSeq * Math.max(0, d.decoding);

/** Predicted TTFT of D prefilling alone, and the decode harm it does there. */
export function localPrediction(d: PredictedNode, onD: RequestSize): LocalPrediction {
  return { ttftMs: prefillDoneMs(d, onD) + stepMsOf(d), harmMs: prefillHarmMs(d, onD) };
}

/**
 * D has KV room for the whole prompt (a local prefill computes all of it there): its projected KV use
 * with the prompt stays below `kvBusy`. Without a reported capacity nothing says it has not.
 */
export function hasKvRoom(kvUsage: number | null | undefined, capacityTokens: number | null | undefined, promptTokens: number, kvBusy: number): boolean {
  if (kvUsage == null || !capacityTokens || !(capacityTokens > 0)) return true;
  return kvUsage + Math.max(0, promptTokens) / capacityTokens < kvBusy;
}

/**
 * The policies' own pick keeps a request unless another option is predicted faster by this share
 * of it: prefix stickiness yields only to a clearly better node, so predictions that differ by
 * noise do not move conversations off their caches (llm-d breaks stickiness by a margin too).
 */
export const STICKY_MARGIN = 0.2;

/** Whether `best` beats the policies' pick `incumbent` by the margin (scores in ms). */
export const beatsIncumbent = (best: number, incumbent: number): boolean => best < incumbent * (1 - STICKY_MARGIN);
