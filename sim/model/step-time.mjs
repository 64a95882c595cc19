// How long one engine step takes, from the batch it runs (a roofline: a step is bound either by
// compute or by reading memory, whichever is slower, plus a fixed per-step cost).
//
// - Every token of the step (one per decoding sequence, `tokens` per prefill chunk) costs the
//   model's linear FLOPs (2 x active parameters) and its attention over its context: 4 x layers x
//   query heads x head dim FLOPs per context token (QK^T and AV, 2 FLOPs a multiply-add).
//   A prefill chunk of n new tokens after p context tokens attends to p + (i+1) tokens for its
//   i-th token: n x (p + (n+1)/2) token pairs. This is where long prompts become quadratic.
// - Every step reads the weights once (for a MoE, the experts the step's tokens route to:
//   with E experts and k a token, T tokens touch E x (1 - (1 - k/E)^T) of them on average) and the
//   KV of every sequence's context. Decode steps are bound by this read: their time grows with
//   the batch and the context each sequence reads.
// - A prefill chunk in the same step as decodes lengthens that step for every sequence in it:
//   that is the ITL/TPOT interference of colocated serving, and of a decode node prefilling.
//
// All figures are per engine (one GPU, or one tensor-parallel group treated as one).

/**
 * Coefficients of the step-time model, derived from the hardware and model of a preset
 * (sim/presets.mjs) with their units.
 * @typedef {object} StepCost
 * @property {number} flopsPerMs achieved FLOPs a simulated millisecond (peak x MFU / 1000)
 * @property {number} bytesPerMs achieved HBM bytes a simulated millisecond (bandwidth x MBU / 1000)
 * @property {number} stepOverheadMs fixed cost of every step (scheduling, sampling, launch)
 * @property {number} perSeqMs cost a sequence in the step (0 for the public presets)
 * @property {number} linearFlopsPerToken 2 x active parameters
 * @property {number} attnFlopsPerPair 4 x layers x query heads x head dim
 * @property {number} denseWeightBytes weights every step reads (all of a dense model; a MoE's non-expert part)
 * @property {number} expertWeightBytes all experts' weights (0 for a dense model)
 * @property {number} experts experts a MoE layer has (0: dense)
 * @property {number} expertsPerToken experts a token routes to
 * @property {number} kvBytesPerToken KV cache bytes a token (2 x layers x KV heads x head dim x dtype bytes)
 */

/**
 * One step's work.
 * @typedef {object} Batch
 * @property {number[]} decodeContexts context length (tokens) of each decoding sequence
 * @property {{ tokens: number, context: number }[]} prefills chunks: new tokens after `context` tokens already in KV
 */

/**
 * Expected share of a MoE layer's experts that `tokens` tokens route to.
 * @param {number} tokens @param {number} experts @param {number} perToken
 */
export function touchedExpertShare(tokens, experts, perToken) {
  if (!(experts > 0)) return 1;
  if (tokens <= 0) return 0;
  return 1 - (1 - perToken / experts) ** tokens;
}

/**
 * The time of one step in simulated ms (0 for an empty batch), and what bounds it.
 * @param {StepCost} c @param {Batch} b
 * @returns {{ ms: number, computeMs: number, memoryMs: number, tokens: number }}
 */
export function stepTime(c, b) {
  let tokens = b.decodeContexts.length;
  let pairs = 0;
  let kvRead = 0;
  for (const ctx of b.decodeContexts) {
    pairs += ctx;
    kvRead += ctx;
  }
  for (const p of b.prefills) {
    tokens += p.tokens;
    pairs += p.tokens * (p.context + (p.tokens + 1) / 2);
    kvRead += p.context + p.tokens;
  }
  if (tokens === 0) return { ms: 0, computeMs: 0, memoryMs: 0, tokens: 0 };
  const flops = c.linearFlopsPerToken * tokens + c.attnFlopsPerPair * pairs;
  const weightBytes = c.denseWeightBytes + c.expertWeightBytes * touchedExpertShare(tokens, c.experts, c.expertsPerToken);
  const computeMs = flops / c.flopsPerMs;
  const memoryMs = (weightBytes + c.kvBytesPerToken * kvRead) / c.bytesPerMs;
  const seqs = b.decodeContexts.length + b.prefills.length;
  return { ms: c.stepOverheadMs + c.perSeqMs * seqs + Math.max(computeMs, memoryMs), computeMs, memoryMs, tokens };
}
