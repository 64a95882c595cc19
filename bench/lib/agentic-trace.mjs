// A sessioned agentic trace with the profile of seed 002's workload, from a seeded generator
// (same seed, same trace), in the Mooncake trace format (512-token `hash_ids`, prefix-chained):
// bench/lib/trace.mjs turns it into prompts (same block id, same text).
//
// The profile the study published: input tokens mean 33.6k, p50 20k, p90 88k; output mean 445,
// p50 80; 90% of sessions single-turn; a shared system prompt; a 71% infinite-cache hit ceiling
// (blocks seen before / all blocks, in arrival order). The generator's parameters below were
// chosen to give that profile (bench test: agentic-trace); they shape the workload, not the
// engine model.
//
// - Every request starts with the same system prompt (tool definitions and instructions).
// - A single-turn session is the system prompt plus one task (log-normal length).
// - A multi-turn session is an agent loop: each turn's prompt is the previous prompt, the
//   previous answer, and new material (a tool's output: log-normal length), until the context
//   reaches its cap. Its next turn leaves after the answer plus a tool's run time.
// - Outputs are log-normal (median 80, mean 445: mostly short tool calls, some long answers).
// - Sessions arrive as a Poisson process (rate set by the scenario).
import { mulberry32 } from './text.mjs';

export const BLOCK_TOKENS = 512;

/** The generator's parameters (tokens unless said). */
export const AGENTIC_PROFILE = {
  systemPromptTokens: 6144,
  singleTurnShare: 0.9,
  /** single-turn task: log-normal median and sigma */
  taskMedian: 7000,
  taskSigma: 1.15,
  /** multi-turn: first task, then each turn's new material */
  firstTaskMedian: 3000,
  firstTaskSigma: 0.8,
  stepMedian: 4500,
  stepSigma: 1.0,
  /** turns a multi-turn session has: 1 + geometric(mean) */
  meanExtraTurns: 11,
  contextCapTokens: 131072,
  /** output: log-normal, median 80; sigma 1.95 gives a mean of 445 under the 8192 cap */
  outputMedian: 80,
  outputSigma: 1.95,
  outputCap: 8192,
  /** simulated seconds a tool runs between an answer and the session's next turn (exponential mean) */
  toolMeanS: 3,
};

/** Of seeds 1-40, the one whose 1,000 requests come closest to the published profile
 * (mean 34.2k, p50 20.5k, p90 84.2k input; 449 / 86 output; ceiling 0.714; 91% single-turn). */
export const AGENTIC_SEED = 30;

/**
 * @typedef {{ session: number, turn: number, turns: number, arrivalS: number, input_length: number, output_length: number, hash_ids: number[], thinkS: number }} AgenticRequest
 *   arrivalS: the session's arrival (a later turn leaves thinkS after the previous answer)
 */

/**
 * The trace: `requests` requests in sessions, in session-arrival order.
 * @param {{ requests: number, seed?: number, sessionsPerS?: number, profile?: Partial<typeof AGENTIC_PROFILE> }} o
 * @returns {AgenticRequest[]}
 */
export function agenticTrace({ requests, seed = AGENTIC_SEED, sessionsPerS = 1, profile = {} }) {
  const p = { ...AGENTIC_PROFILE, ...profile };
  const rand = mulberry32(seed);
  const normal = () => {
    // Box-Muller
    const u = Math.max(1e-12, rand());
    return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * rand());
  };
  const logNormal = (/** @type {number} */ median, /** @type {number} */ sigma) => median * Math.exp(sigma * normal());
  const exponential = (/** @type {number} */ mean) => -mean * Math.log(Math.max(1e-12, rand()));
  let nextBlock = 0;
  const fresh = (/** @type {number} */ n) => Array.from({ length: n }, () => nextBlock++);
  const systemBlocks = fresh(Math.ceil(p.systemPromptTokens / BLOCK_TOKENS));
  /** @type {AgenticRequest[]} */
  const out = [];
  let t = 0;
  for (let session = 0; out.length < requests; session++) {
    t += exponential(1 / sessionsPerS);
    const output = () => Math.max(1, Math.min(p.outputCap, Math.round(logNormal(p.outputMedian, p.outputSigma))));
    if (rand() < p.singleTurnShare) {
      const task = Math.max(16, Math.round(logNormal(p.taskMedian, p.taskSigma)));
      const input = Math.min(p.contextCapTokens, p.systemPromptTokens + task);
      out.push({
        session,
        turn: 1,
        turns: 1,
        arrivalS: t,
        input_length: input,
        output_length: output(),
        hash_ids: [...systemBlocks, ...fresh(Math.ceil(input / BLOCK_TOKENS) - systemBlocks.length)],
        thinkS: 0,
      });
      continue;
    }
    // an agent loop: the context only grows; blocks are the previous prompt's, then fresh ones
    let turns = 1;
    while (rand() > 1 / (1 + p.meanExtraTurns)) turns++;
    let input = p.systemPromptTokens + Math.max(16, Math.round(logNormal(p.firstTaskMedian, p.firstTaskSigma)));
    /** @type {number[]} */
    let blocks = [...systemBlocks];
    /** @type {AgenticRequest[]} */
    const sessionRequests = [];
    for (let turn = 1; turn <= turns && out.length + sessionRequests.length < requests; turn++) {
      if (turn > 1) {
        const previous = sessionRequests[sessionRequests.length - 1];
        const grown = previous.input_length + previous.output_length + Math.max(16, Math.round(logNormal(p.stepMedian, p.stepSigma)));
        if (grown > p.contextCapTokens) break;
        input = grown;
      }
      // full blocks of the previous prompt stay; its partial last block and what follows are new
      const keep = Math.floor((sessionRequests.at(-1)?.input_length ?? p.systemPromptTokens) / BLOCK_TOKENS);
      blocks = [...blocks.slice(0, Math.min(blocks.length, keep)), ...fresh(Math.ceil(input / BLOCK_TOKENS) - Math.min(blocks.length, keep))];
      sessionRequests.push({
        session,
        turn,
        turns,
        arrivalS: t,
        input_length: input,
        output_length: output(),
        hash_ids: blocks,
        thinkS: turn === 1 ? 0 : exponential(p.toolMeanS),
      });
    }
    for (const r of sessionRequests) r.turns = sessionRequests.length;
    out.push(...sessionRequests);
  }
  return out.slice(0, requests);
}

/**
 * The trace's profile, to compare with the published one.
 * @param {AgenticRequest[]} trace
 */
export function agenticProfile(trace) {
  const q = (/** @type {number[]} */ xs, /** @type {number} */ p) => {
    const s = [...xs].sort((a, b) => a - b);
    return s[Math.max(0, Math.ceil((p / 100) * s.length) - 1)];
  };
  const inputs = trace.map((r) => r.input_length);
  const outputs = trace.map((r) => r.output_length);
  const sessions = new Map();
  for (const r of trace) sessions.set(r.session, r.turns);
  const seen = new Set();
  let hits = 0;
  let total = 0;
  for (const r of trace) {
    for (const id of r.hash_ids) {
      total++;
      if (seen.has(id)) hits++;
      else seen.add(id);
    }
  }
  return {
    requests: trace.length,
    sessions: sessions.size,
    singleTurnSessionShare: [...sessions.values()].filter((n) => n === 1).length / sessions.size,
    inputMean: inputs.reduce((a, b) => a + b, 0) / inputs.length,
    inputP50: q(inputs, 50),
    inputP90: q(inputs, 90),
    outputMean: outputs.reduce((a, b) => a + b, 0) / outputs.length,
    outputP50: q(outputs, 50),
    ceiling: total === 0 ? 0 : hits / total,
  };
}
