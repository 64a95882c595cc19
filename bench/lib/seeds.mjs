// The figures the seeds published (issue 16), which the scenarios reproduce on the simulator.
// Each comparison is a ratio between two configurations of the same run; the scenarios report
// ours beside it.
import { markdownTable } from './report.mjs';

/** Seed 000: prefix-affinity P/D, 2P+2D on 4 x H200, 400G IB per GPU, Qwen3-14B bf16. */
export const SEED000 = {
  workload: '60 conversations x 5 turns, first turn 8192 tokens + 2048 a turn, 128 out, concurrency 12',
  configs: {
    round_robin: { outTokPerS: 437, tpotP99Ms: 38.9, itlP99Ms: 85.2 },
    p_affinity: { outTokPerS: 465, tpotP99Ms: 30.8, itlP99Ms: 49.2 },
    pd_affinity: { outTokPerS: 495, tpotP99Ms: 22.8, itlP99Ms: 23.0 },
    isolation_1p1d: { itlP99Ms: 23.6, outTokPerS: 495 / 2.5 },
  },
  counts: {
    prefillCrossNodeFetches: { round_robin: 30, pd_affinity: 1 },
    decodeFullRepulls: { round_robin: 93, pd_affinity: 60 },
  },
};

/** Seed 002: cache-aware study, 8 x H20, vLLM 0.18.1 + Mooncake, Qwen3-Coder-30B-A3B, an agentic trace. */
export const SEED002 = {
  workload: 'agentic: avg input 33.6k tokens (p50 20k, p90 88k), output avg 445 (p50 80), 90% single-turn sessions, 71% infinite-cache ceiling',
  configs: {
    'colocated-8/cache_aware': { ttftP50Ms: 731, tpotP90Ms: 73, e2eP50Ms: 4480, hitRatio: 0.447 },
    'colocated-8/round_robin': { ttftP50Ms: 1836, tpotP90Ms: 86, e2eP50Ms: 6670, hitRatio: 0.208 },
    'pd-4p4d/cache_aware': { ttftP50Ms: 1261, tpotP90Ms: 74, e2eP50Ms: 5610, hitRatio: 0.402 },
    'pd-6p2d/cache_aware': { ttftP50Ms: 1481, tpotP90Ms: 77, decodeKvPeak: 0.971, kvWaitShare: 0.877 },
  },
};

/**
 * A published comparison and ours: the ratio a / b, whether ours points the same way, and whether
 * it lands within `tolerance` (relative) of the published ratio.
 * @param {string} what @param {number} publishedA @param {number} publishedB @param {number} oursA @param {number} oursB
 * @param {number} [tolerance] default 0.35
 */
export function compareRatio(what, publishedA, publishedB, oursA, oursB, tolerance = 0.35) {
  const published = publishedA / publishedB;
  const ours = oursA / oursB;
  const sameDirection = Math.sign(published - 1) === Math.sign(ours - 1) || (Math.abs(published - 1) < 0.02 && Math.abs(ours - 1) < 0.05);
  // a ratio pointing the other way is not "within" however close its size
  const within = sameDirection && Number.isFinite(ours) && Math.abs(ours / published - 1) <= tolerance;
  return { what, published: round2(published), ours: round2(ours), sameDirection, within };
}

/**
 * The published comparisons we can make: for each [a, b, figure, what], the ratio a / b of that
 * figure published and ours, when both configurations ran and the seed published both figures.
 * @param {Record<string, Record<string, any>>} ours results by configuration
 * @param {Record<string, Record<string, number>>} published the seed's figures by configuration
 * @param {Array<[string, string, string, string]>} pairs
 */
export function comparePairs(ours, published, pairs) {
  return pairs
    .filter(([a, b, k]) => ours[a] && ours[b] && published[a]?.[k] !== undefined && published[b]?.[k] !== undefined)
    .map(([a, b, k, what]) => compareRatio(what, published[a][k], published[b][k], ours[a][k], ours[b][k]));
}

/** @param {number} x */
function round2(x) {
  return Number.isFinite(x) ? Math.round(x * 100) / 100 : x;
}

/** @param {ReturnType<typeof compareRatio>[]} comparisons */
export function comparisonsTable(comparisons) {
  if (comparisons.length === 0) return '';
  return markdownTable(
    ['comparison', 'published', 'ours', 'same direction', 'within ±35%'],
    comparisons.map((c) => [c.what, `${c.published}x`, ratioCell(c.ours), c.sameDirection ? 'yes' : 'NO', c.within ? 'yes' : 'no']),
  );
}

/**
 * A ratio of ours: one over a count of 0 is infinite, which JSON writes as null; both print alike
 * so that a table rebuilt from the JSON (`npm run bench -- docs`) is the one the run printed.
 * @param {number | null} ours
 */
function ratioCell(ours) {
  return typeof ours === 'number' && Number.isFinite(ours) ? `${ours}x` : 'n/a (a count of 0 below it)';
}
