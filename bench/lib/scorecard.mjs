// The seeds' scorecard (issue 22): every published comparison of the three seeds (25, listed in
// ../shared/data/published-figures.md) beside ours, from the headline runs' JSON in bench/results/.
// Each row: the published figures and the run they come from, ours and the run they come from,
// whether ours points the published way, and the effect size against the published one:
// |ln(ours) / ln(published) - 1| <= 0.35 (the raw ratio ours / published beside it). A published
// ratio within 5% of 1 ("about the same", "matches") has no effect size to scale: ours then passes
// both when it is within 10% of 1 too. Rows that contain a fitted figure are marked.
import { markdownTable } from './report.mjs';
import { SEED000, SEED002 } from './seeds.mjs';

export const EFFECT_TOLERANCE = 0.35;
/** a published ratio this close to 1 is "flat": no direction, no effect size */
const FLAT_PUBLISHED = 0.05;
const FLAT_OURS = 0.1;

/**
 * @typedef {object} Side the two figures of a ratio: a / b
 * @property {number} a @property {number} b @property {string} unit @property {string} run where they come from
 *
 * @typedef {object} ScoreRow
 * @property {number} n the comparison's number in published-figures.md
 * @property {string} seed
 * @property {string} what
 * @property {Side} published
 * @property {Side | undefined} ours undefined: the run is missing
 * @property {number} publishedRatio
 * @property {number | 'inf' | null} oursRatio
 * @property {boolean} direction ours points the published way
 * @property {number | 'inf' | null} effect |ln ours / ln published - 1| (null for a flat published ratio)
 * @property {boolean} within the effect size within tolerance
 * @property {number | 'inf' | null} raw ours / published
 * @property {string[]} fitted the fitted figures this row contains
 */

/**
 * @param {number} publishedRatio @param {number} oursRatio
 * @returns {{ direction: boolean, effect: number | null, within: boolean }}
 */
export function score(publishedRatio, oursRatio) {
  if (!(oursRatio > 0) || Number.isNaN(oursRatio)) return { direction: false, effect: null, within: false };
  const lp = Math.log(publishedRatio);
  const lo = Math.log(oursRatio);
  if (Math.abs(publishedRatio - 1) < FLAT_PUBLISHED) {
    const flat = Math.abs(oursRatio - 1) < FLAT_OURS;
    return { direction: flat, effect: null, within: flat };
  }
  const direction = Math.sign(lo) === Math.sign(lp);
  const effect = Number.isFinite(lo) ? Math.abs(lo / lp - 1) : Infinity;
  return { direction, effect, within: direction && effect <= EFFECT_TOLERANCE };
}

/** Rounded; an infinite ratio (a count of 0 below it) as the string 'inf', which JSON keeps. */
const r3 = (/** @type {number} */ x) => (Number.isFinite(x) ? Math.round(x * 1000) / 1000 : x === Infinity ? /** @type {any} */ ('inf') : x);

/**
 * The runs the scorecard reads, by name: `multiturn` (seed 000), `agentic` (seed 002, 1,000
 * requests), `ablation` (seed 002, 200 requests), `breakdown` (seed 002, 6P+2D await, 50 requests).
 * @typedef {{ multiturn?: any, agentic?: any, ablation?: any, breakdown?: any }} Runs
 */

/** Run files (bench/results/) the scorecard reads. */
export const RUN_FILES = {
  multiturn: 'multiturn.json',
  agentic: 'agentic.json',
  ablation: 'agentic-ablation.json',
  breakdown: 'agentic-breakdown.json',
};

/** The fitted figures (docs/simulator.md): what they are and which parameter each fits. */
export const FITTED = {
  'seed000 P affinity ITL p99': 'stallLoadShare (the step loop stalling while KV moves)',
  'seed000 P+D affinity TPOT p99': 'mbu (decode memory bandwidth use)',
  'seed002 colocated cache-aware TTFT p50': 'mfu (prefill rate)',
  'seed002 PD 4P+4D TPOT p90': 'stepOverheadMs (eager-mode step)',
};

/**
 * Every published comparison with ours.
 * @param {Runs} runs
 * @returns {ScoreRow[]}
 */
export function scorecard(runs) {
  const mt = byKey(runs.multiturn?.results, 'config');
  const ag = byKey(runs.agentic?.results, 'name');
  const ab = byKey(runs.ablation?.results, 'name');
  const mtRun = runs.multiturn ? `multiturn (${describeMultiturn(runs.multiturn)})` : 'multiturn: not run';
  const agRun = runs.agentic ? `agentic (${runs.agentic.config?.requests} requests)` : 'agentic: not run';
  const abRun = runs.ablation ? `agentic ablation (${runs.ablation.config?.requests} requests)` : 'agentic ablation: not run';
  const s0 = SEED000.configs;
  const s0c = SEED000.counts;
  const s2 = SEED002.configs;
  const pub000 = 'seed 000 (one run each)';
  const pub002 = 'seed 002 main table (1,000 requests)';
  /** @type {Array<[number, string, string, [number, number, string, string], ((x: Record<string, any>) => number) | undefined, [string, string, Record<string, any>, string, string], string[]]>} */
  const rows = [];
  const ITL = (/** @type {any} */ r) => r.itlP99Ms;
  const TPOT99 = (/** @type {any} */ r) => r.tpotP99Ms;
  const TOK = (/** @type {any} */ r) => r.outTokPerS;
  const m = (/** @type {string} */ a, /** @type {string} */ b) => /** @type {[string, string, Record<string, any>, string, string]} */ ([a, b, mt, mtRun, 'multiturn']);
  const g = (/** @type {string} */ a, /** @type {string} */ b) => /** @type {[string, string, Record<string, any>, string, string]} */ ([a, b, ag, agRun, 'agentic']);
  const x = (/** @type {string} */ a, /** @type {string} */ b) => /** @type {[string, string, Record<string, any>, string, string]} */ ([a, b, ab, abRun, 'ablation']);
  const F0i = 'seed000 P affinity ITL p99';
  const F0t = 'seed000 P+D affinity TPOT p99';
  const F2t = 'seed002 colocated cache-aware TTFT p50';
  const F2p = 'seed002 PD 4P+4D TPOT p90';
  rows.push(
    [1, '000', 'ITL p99 round-robin / P+D affinity', [s0.round_robin.itlP99Ms, s0.pd_affinity.itlP99Ms, 'ms', pub000], ITL, m('round_robin', 'pd_affinity'), []],
    [2, '000', 'ITL p99 P affinity / P+D affinity', [s0.p_affinity.itlP99Ms, s0.pd_affinity.itlP99Ms, 'ms', pub000], ITL, m('p_affinity', 'pd_affinity'), [F0i]],
    [3, '000', 'ITL p99 round-robin / P affinity', [s0.round_robin.itlP99Ms, s0.p_affinity.itlP99Ms, 'ms', pub000], ITL, m('round_robin', 'p_affinity'), [F0i]],
    [4, '000', 'TPOT p99 round-robin / P+D affinity', [s0.round_robin.tpotP99Ms, s0.pd_affinity.tpotP99Ms, 'ms', pub000], TPOT99, m('round_robin', 'pd_affinity'), [F0t]],
    [5, '000', 'TPOT p99 P affinity / P+D affinity', [s0.p_affinity.tpotP99Ms, s0.pd_affinity.tpotP99Ms, 'ms', pub000], TPOT99, m('p_affinity', 'pd_affinity'), [F0t]],
    [6, '000', 'TPOT p99 round-robin / P affinity', [s0.round_robin.tpotP99Ms, s0.p_affinity.tpotP99Ms, 'ms', pub000], TPOT99, m('round_robin', 'p_affinity'), []],
    [7, '000', 'out tok/s P+D affinity / round-robin', [s0.pd_affinity.outTokPerS, s0.round_robin.outTokPerS, 'tok/s', pub000], TOK, m('pd_affinity', 'round_robin'), []],
    [8, '000', 'out tok/s P+D affinity / P affinity', [s0.pd_affinity.outTokPerS, s0.p_affinity.outTokPerS, 'tok/s', pub000], TOK, m('pd_affinity', 'p_affinity'), []],
    [9, '000', 'out tok/s P affinity / round-robin', [s0.p_affinity.outTokPerS, s0.round_robin.outTokPerS, 'tok/s', pub000], TOK, m('p_affinity', 'round_robin'), []],
    [
      10,
      '000',
      'ITL p99 P+D affinity / 1P+1D baseline',
      [s0.pd_affinity.itlP99Ms, s0.isolation_1p1d.itlP99Ms, 'ms', `${pub000}; the baseline's load is not given`],
      ITL,
      m('pd_affinity', 'isolation_1p1d'),
      [],
    ],
    [
      11,
      '000',
      'out tok/s 2P+2D P+D affinity / 1P+1D baseline',
      [2.5, 1, 'x', `${pub000}; "2.5x"; the baseline's load is not given (ours: half the clients)`],
      TOK,
      m('pd_affinity', 'isolation_1p1d'),
      [],
    ],
    [
      12,
      '000',
      'D full-context re-pulls after the first turn, round-robin / P+D affinity',
      [s0c.decodeFullRepulls.round_robin, s0c.decodeFullRepulls.pd_affinity, 're-pulls', `${pub000}; the 60 are post-eviction restores`],
      (r) => r.dFullRepullsAfterFirst,
      m('round_robin', 'pd_affinity'),
      [],
    ],
    [
      13,
      '000',
      'P cross-node prefix fetches, round-robin / P+D affinity',
      [s0c.prefillCrossNodeFetches.round_robin, s0c.prefillCrossNodeFetches.pd_affinity, 'fetches', pub000],
      (r) => r.prefillCrossNodeFetches,
      m('round_robin', 'pd_affinity'),
      [],
    ],
    [
      14,
      '002',
      'TTFT p50 colocated round-robin / colocated cache-aware',
      [s2['colocated-8/round_robin'].ttftP50Ms, s2['colocated-8/cache_aware'].ttftP50Ms, 'ms', pub002],
      (r) => r.ttftP50Ms,
      g('colocated-8/round_robin', 'colocated-8/cache_aware'),
      [F2t],
    ],
    [
      15,
      '002',
      'TTFT p50 PD 4P+4D / colocated cache-aware',
      [s2['pd-4p4d/cache_aware'].ttftP50Ms, s2['colocated-8/cache_aware'].ttftP50Ms, 'ms', pub002],
      (r) => r.ttftP50Ms,
      g('pd-4p4d/cache_aware', 'colocated-8/cache_aware'),
      [F2t],
    ],
    [
      16,
      '002',
      'TTFT p50 PD 6P+2D / colocated cache-aware',
      [s2['pd-6p2d/cache_aware'].ttftP50Ms, s2['colocated-8/cache_aware'].ttftP50Ms, 'ms', `${pub002}; 6P+2D from the headline table`],
      (r) => r.ttftP50Ms,
      g('pd-6p2d/cache_aware', 'colocated-8/cache_aware'),
      [F2t],
    ],
    [
      17,
      '002',
      'TTFT p50 PD 6P+2D / PD 4P+4D, like for like',
      [0.74, 1, 'x', 'seed 002 ablation (200 requests): -26%'],
      (r) => r.ttftP50Ms,
      x('pd-6p2d/cache_aware', 'pd-4p4d/cache_aware'),
      [],
    ],
    [
      18,
      '002',
      'TPOT p90 colocated round-robin / colocated cache-aware',
      [s2['colocated-8/round_robin'].tpotP90Ms, s2['colocated-8/cache_aware'].tpotP90Ms, 'ms', pub002],
      (r) => r.tpotP90Ms,
      g('colocated-8/round_robin', 'colocated-8/cache_aware'),
      [],
    ],
    [
      19,
      '002',
      'TPOT p90 PD 4P+4D / colocated cache-aware',
      [s2['pd-4p4d/cache_aware'].tpotP90Ms, s2['colocated-8/cache_aware'].tpotP90Ms, 'ms', pub002],
      (r) => r.tpotP90Ms,
      g('pd-4p4d/cache_aware', 'colocated-8/cache_aware'),
      [F2p],
    ],
    [
      20,
      '002',
      'TPOT p90 PD 6P+2D / colocated cache-aware',
      [s2['pd-6p2d/cache_aware'].tpotP90Ms, s2['colocated-8/cache_aware'].tpotP90Ms, 'ms', `${pub002}; 6P+2D from the headline table`],
      (r) => r.tpotP90Ms,
      g('pd-6p2d/cache_aware', 'colocated-8/cache_aware'),
      [],
    ],
    [
      21,
      '002',
      'TPOT p90 PD 6P+2D / PD 4P+4D (ablation)',
      [1, 1, 'x', 'seed 002 ablation (200 requests): "about the same"'],
      (r) => r.tpotP90Ms,
      x('pd-6p2d/cache_aware', 'pd-4p4d/cache_aware'),
      [],
    ],
    [
      22,
      '002',
      'E2E p50 colocated round-robin / colocated cache-aware',
      [s2['colocated-8/round_robin'].e2eP50Ms, s2['colocated-8/cache_aware'].e2eP50Ms, 'ms', pub002],
      (r) => r.e2eP50Ms,
      g('colocated-8/round_robin', 'colocated-8/cache_aware'),
      [],
    ],
    [
      23,
      '002',
      'E2E p50 PD 4P+4D / colocated cache-aware',
      [s2['pd-4p4d/cache_aware'].e2eP50Ms, s2['colocated-8/cache_aware'].e2eP50Ms, 'ms', pub002],
      (r) => r.e2eP50Ms,
      g('pd-4p4d/cache_aware', 'colocated-8/cache_aware'),
      [],
    ],
    [
      24,
      '002',
      'APC colocated cache-aware / colocated round-robin',
      [s2['colocated-8/cache_aware'].hitRatio, s2['colocated-8/round_robin'].hitRatio, 'hit ratio', pub002],
      (r) => r.hitRatio,
      g('colocated-8/cache_aware', 'colocated-8/round_robin'),
      [],
    ],
    [
      25,
      '002',
      'APC colocated cache-aware / PD 4P+4D',
      [s2['colocated-8/cache_aware'].hitRatio, s2['pd-4p4d/cache_aware'].hitRatio, 'hit ratio', pub002],
      (r) => r.hitRatio,
      g('colocated-8/cache_aware', 'pd-4p4d/cache_aware'),
      [],
    ],
  );
  return rows.map(([n, seed, what, [pa, pb, unit, pubRun], fig, [a, b, res, run, source], fitted]) => {
    const publishedRatio = pa / pb;
    const ra = res[a];
    const rb = res[b];
    const oa = ra && fig ? Number(fig(ra)) : NaN;
    const ob = rb && fig ? Number(fig(rb)) : NaN;
    const have = Number.isFinite(oa) && Number.isFinite(ob);
    // a count of 0 stays 0: 30 / 0 is infinite, not 30 / 1
    const oursRatio = have ? (ob === 0 ? (oa === 0 ? 1 : Infinity) : oa / ob) : null;
    const s = oursRatio === null ? { direction: false, effect: null, within: false } : score(publishedRatio, oursRatio);
    return {
      n,
      seed,
      what,
      published: { a: pa, b: pb, unit, run: pubRun },
      ours: have ? { a: r3(oa), b: r3(ob), unit: unit === 'x' ? (source === 'multiturn' ? 'tok/s' : 'ms') : unit, run: `${run}: ${a} / ${b}` } : undefined,
      publishedRatio: r3(publishedRatio),
      oursRatio: oursRatio === null ? null : r3(oursRatio),
      direction: s.direction,
      effect: s.effect === null ? null : r3(s.effect),
      within: s.within,
      raw: oursRatio === null ? null : r3(oursRatio / publishedRatio),
      fitted,
    };
  });
}

/**
 * The figures judged on their own (not ratios): decode KV on both PD shapes, the share of TTFT
 * waiting for decode KV (await breakdown), fire-and-forget vs await.
 * @param {Runs} runs
 */
export function diagnostics(runs) {
  const ab = byKey(runs.ablation?.results, 'name');
  const ag = byKey(runs.agentic?.results, 'name');
  const bd = byKey(runs.breakdown?.results, 'name');
  const out = [];
  for (const [name, src, label] of /** @type {const} */ ([
    ['pd-6p2d/cache_aware', ab, 'ablation'],
    ['pd-4p4d/cache_aware', ab, 'ablation'],
    ['pd-6p2d/cache_aware', ag, 'main'],
    ['pd-4p4d/cache_aware', ag, 'main'],
  ])) {
    const r = src[name];
    out.push({
      what: `decode KV peak / mean, ${name} (${label} run)`,
      published: 'peak ~0.97 on both PD shapes (200-request runs); 0.971 on 6P+2D',
      ours: r ? `${r.decodeKvPeak} / ${r.decodeKvMean}` : 'not run',
    });
  }
  const b = bd['pd-6p2d/cache_aware'];
  out.push({
    what: 'share of TTFT waiting for decode KV, 6P+2D await (breakdown run)',
    published: '0.877 (TTFT p50 110.2 s; prefill p50 0.108 s), 50 requests',
    ours: b
      ? `${b.kvWaitShare} (TTFT p50 ${r3(b.ttftP50Ms / 1000)} s; after P: ${r3(b.ttftBreakdown.handoffMs / 1000)} s of a ${r3(b.ttftBreakdown.ttftMeanMs / 1000)} s mean, ${r3(b.ttftBreakdown.handoffKvMs / 1000)} s waiting for KV)`
      : 'not run',
  });
  // the main run's 6P+2D: read as the study's scheduler (no engine signals: agentic.mjs
  // hideEngineSignals) a request waits for decode KV inside an engine, as the study's did; with the
  // router's decode KV guard (runs before, or a row with signals) it waits at the edge instead
  const m = ag['pd-6p2d/cache_aware'];
  const guarded = m?.engineSignals !== false;
  out.push({
    what: `share of TTFT waiting for decode KV, 6P+2D (main run${guarded ? ', the router reading engine signals' : ', the router reading no engine signals, as the study'}): inside the engines + at the router's edge (its decode KV guard)`,
    published: 'not published for the main run; the breakdown run: 0.877, inside the engines (no router guard)',
    ours: m
      ? `${m.kvWaitShare} + ${m.edgeWaitShare ?? 0} (${m.edgeQueued ?? 0} of ${m.completed} requests held at the edge, p90 ${r3((m.edgeQueueP90Ms ?? 0) / 1000)} s)`
      : 'not run',
  });
  const aw = ab['pd-6p2d/cache_aware'];
  const ff = ab['pd-6p2d/fire-and-forget'];
  out.push({
    what: 'fire-and-forget vs await, 6P+2D: TTFT p50, TPOT p90',
    published: '+260% TTFT, -44% TPOT p90 (200 requests)',
    ours: aw && ff ? `${pct(ff.ttftP50Ms / aw.ttftP50Ms)} TTFT, ${pct(ff.tpotP90Ms / aw.tpotP90Ms)} TPOT p90 (KV wait share ${ff.kvWaitShare} vs ${aw.kvWaitShare})` : 'not run',
  });
  return out;
}

/** @param {number} ratio */
function pct(ratio) {
  const p = Math.round((ratio - 1) * 100);
  return `${p >= 0 ? '+' : ''}${p}%`;
}

/** @param {any} report */
function describeMultiturn(report) {
  const c = report.config ?? {};
  return `${c.conversations} conversations x ${c.turns} turns, concurrency ${c.concurrency}`;
}

/** @param {Record<string, any>[] | undefined} results @param {string} key */
function byKey(results, key) {
  return Object.fromEntries((results ?? []).map((r) => [r[key], r]));
}

/** @param {ScoreRow[]} rows */
export function summary(rows) {
  return {
    comparisons: rows.length,
    direction: rows.filter((r) => r.direction).length,
    within: rows.filter((r) => r.within).length,
    fittedRows: rows.filter((r) => r.fitted.length > 0).length,
    missingRuns: rows.filter((r) => !r.ours).length,
  };
}

/**
 * The scorecard as markdown: the summary, the table, the diagnostics. docs/benchmark-seeds.md
 * holds this between its `generated` markers (bench run `seeds` writes it; a test checks it).
 * @param {{ rows: ScoreRow[], diagnostics: ReturnType<typeof diagnostics>, summary: ReturnType<typeof summary>, sources: Record<string, string> }} card
 */
export function scorecardMarkdown(card) {
  const f = (/** @type {number | string} */ v) => (typeof v === 'number' && Number.isFinite(v) ? String(v) : v === 'inf' ? '∞' : 'n/a');
  const s = card.summary;
  const lines = [
    `${s.direction} of ${s.comparisons} comparisons point the published way; ${s.within} within ±35% on effect size (|ln ours / ln published - 1| <= 0.35). Rows marked * contain a fitted figure (${s.fittedRows}).`,
    '',
    markdownTable(
      ['#', 'seed', 'comparison', 'published (a / b)', 'ours (a / b)', 'published ratio', 'ours ratio', 'direction', 'effect size', 'raw ours / published'],
      card.rows.map((r) => [
        `${r.n}${r.fitted.length ? '*' : ''}`,
        r.seed,
        r.what,
        `${f(r.published.a)} / ${f(r.published.b)} ${r.published.unit}`,
        r.ours ? `${f(r.ours.a)} / ${f(r.ours.b)} ${r.ours.unit}` : 'not run',
        `${f(r.publishedRatio)}x`,
        r.oursRatio === null ? '' : `${f(r.oursRatio)}x`,
        r.direction ? 'yes' : 'NO',
        r.effect === null ? (r.within ? 'flat, ok' : 'flat, no') : `${f(r.effect)}${r.within ? ' ok' : ''}`,
        r.raw === null ? '' : `${f(r.raw)}`,
      ]),
    ),
    '',
    'Where each figure comes from:',
    '',
    markdownTable(
      ['#', 'published run', 'our run'],
      card.rows.map((r) => [r.n, r.published.run, r.ours?.run ?? 'not run']),
    ),
    '',
    'Judged on their own:',
    '',
    markdownTable(
      ['figure', 'published', 'ours'],
      card.diagnostics.map((d) => [d.what, d.published, d.ours]),
    ),
    '',
    `Fitted figures: ${Object.entries(FITTED)
      .map(([k, v]) => `${k} -> ${v}`)
      .join('; ')}. Sources: ${Object.entries(card.sources)
      .map(([k, v]) => `${k}: ${v}`)
      .join('; ')}.`,
  ];
  return lines.join('\n');
}

export const DOC_BEGIN = '<!-- generated by `npm run bench -- seeds` from bench/results/seeds.json: do not edit by hand -->';
export const DOC_END = '<!-- end of generated scorecard -->';
export const SPREAD_BEGIN = '<!-- generated by `npm run bench -- seeds-spread` from bench/results/seeds-spread.json: do not edit by hand -->';
export const SPREAD_END = '<!-- end of generated spread -->';

/**
 * The document with its generated part (the scorecard, or the part between other markers) replaced.
 * @param {string} doc @param {string} generated @param {string} [begin] @param {string} [end]
 */
export function spliceGenerated(doc, generated, begin = DOC_BEGIN, end = DOC_END) {
  const i = doc.indexOf(begin);
  const j = doc.indexOf(end);
  if (i < 0 || j < i) throw new Error('docs/benchmark-seeds.md: generated markers missing');
  return `${doc.slice(0, i + begin.length)}\n\n${generated}\n\n${doc.slice(j)}`;
}

/** The generated part of the document. @param {string} doc */
export function generatedPart(doc, begin = DOC_BEGIN, end = DOC_END) {
  const i = doc.indexOf(begin);
  const j = doc.indexOf(end);
  if (i < 0 || j < i) return undefined;
  return doc.slice(i + begin.length, j).trim();
}

/**
 * Several runs of the scorecard side by side (issue 22, item 5: the directions must not change
 * between quiet runs and one on a busy machine): per comparison, ours in each run and whether
 * every run points the same way; per run, its counts and the machine's load.
 * @param {{ label: string, rows: ScoreRow[], loadAverage?: number[] }[]} runs
 */
export function spread(runs) {
  const first = runs[0]?.rows ?? [];
  const rows = first.map((row, i) => {
    const each = runs.map((r) => r.rows[i]);
    const ratios = each.map((r) => r?.oursRatio ?? null).filter((x) => x !== null && Number.isFinite(x));
    const directions = each.map((r) => (r?.ours ? r.direction : null));
    return {
      n: row.n,
      what: row.what,
      publishedRatio: row.publishedRatio,
      ours: each.map((r) => r?.oursRatio ?? null),
      directions,
      within: each.map((r) => (r?.ours ? r.within : null)),
      // the same answer (published way or not) in every run that has the comparison
      stable: new Set(directions.filter((d) => d !== null)).size <= 1,
      min: ratios.length ? Math.min(...ratios) : null,
      max: ratios.length ? Math.max(...ratios) : null,
      pooled: pooledRow(row.publishedRatio, each),
    };
  });
  return {
    runs: runs.map((r) => ({ label: r.label, loadAverage: r.loadAverage, ...summary(r.rows) })),
    rows,
    stable: rows.filter((r) => r.stable).length,
    changed: rows.filter((r) => !r.stable).map((r) => r.n),
    pooled: { direction: rows.filter((r) => r.pooled.direction).length, within: rows.filter((r) => r.pooled.within).length },
  };
}

/**
 * One comparison judged over several runs at once: the geometric mean of its ratio (the mean of
 * the logs the effect size is measured on), scored as one run's would be. Runs of one build on
 * different samples of a workload (trace seeds) differ by sampling, and a single sample's count
 * carries that spread; the pooled ratio is the estimate of what the workload gives. A comparison
 * some run has no finite ratio for (a count of 0 below it, or a missing run) is not pooled: it
 * points the published way, or lands within, only if every run's does.
 * @param {number} publishedRatio @param {(ScoreRow | undefined)[]} each
 * @returns {{ ratio: number | null, direction: boolean, within: boolean }}
 */
export function pooledRow(publishedRatio, each) {
  const ratios = each.map((r) => (r?.ours ? r.oursRatio : null));
  if (ratios.length && ratios.every((x) => typeof x === 'number' && Number.isFinite(x) && x > 0)) {
    const ratio = Math.exp(ratios.reduce((sum, x) => sum + Math.log(/** @type {number} */ (x)), 0) / ratios.length);
    const { direction, within } = score(publishedRatio, ratio);
    return { ratio: r3(ratio), direction, within };
  }
  return { ratio: null, direction: each.length > 0 && each.every((r) => !!r?.ours && r.direction), within: each.length > 0 && each.every((r) => !!r?.ours && r.within) };
}

/** @param {ReturnType<typeof spread>} s */
export function spreadMarkdown(s) {
  const yes = (/** @type {boolean | null} */ d) => (d === null ? '-' : d ? 'yes' : 'NO');
  const fmt = (/** @type {number | null} */ x) => (x === null ? '-' : Number.isFinite(x) ? `${x}x` : '∞x');
  return [
    `${s.stable} of ${s.rows.length} comparisons point the same way in all ${s.runs.length} runs${s.changed.length ? `; changed: #${s.changed.join(', #')}` : ''}.`,
    '',
    '| run | load average (1/5/15 min, at its end) | published way | within ±35% |',
    '|---|---|---|---|',
    ...s.runs.map((r) => `| ${r.label} | ${(r.loadAverage ?? []).map((x) => x.toFixed(1)).join(' / ')} | ${r.direction} | ${r.within} |`),
    ...(s.pooled ? [`| pooled (each ratio's geometric mean over the runs) | - | ${s.pooled.direction} | ${s.pooled.within} |`] : []),
    '',
    `| # | comparison | published | ${s.runs.map((r) => r.label).join(' | ')} | same way in all |${s.pooled ? ' pooled |' : ''}`,
    `|---|---|---|${s.runs.map(() => '---|').join('')}---|${s.pooled ? '---|' : ''}`,
    ...s.rows.map(
      (r) =>
        `| ${r.n} | ${r.what} | ${fmt(r.publishedRatio)} | ${r.ours.map((x, i) => `${fmt(x)} ${yes(r.directions[i])}`).join(' | ')} | ${r.stable ? 'yes' : 'NO'} |${
          r.pooled ? ` ${r.pooled.ratio === null ? '-' : fmt(r.pooled.ratio)} ${yes(r.pooled.direction)}${r.pooled.within ? ', within' : ''} |` : ''
        }`,
    ),
  ].join('\n');
}
