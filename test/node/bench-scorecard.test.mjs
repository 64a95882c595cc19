import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import {
  DOC_BEGIN,
  SPREAD_BEGIN,
  SPREAD_END,
  diagnostics,
  generatedPart,
  score,
  scorecard,
  scorecardMarkdown,
  spliceGenerated,
  spread,
  spreadMarkdown,
} from '../../bench/lib/scorecard.mjs';
import { SEEDS_DOC, SEEDS_JSON } from '../../bench/scenarios/seeds.mjs';

// The seeds' scorecard (issue 22): every published comparison scored on effect size, the counts
// honest, and docs/benchmark-seeds.md generated from bench/results/seeds.json.

describe('scoring a comparison', () => {
  it('tolerates ±35% on effect size (ln ours / ln published), not on the raw ratio', () => {
    // 3.7x published: 2.6x is 0.27 off in effect size (ln 2.6 / ln 3.7), 1.36x is 0.76 off
    expect(score(3.7, 2.6)).toMatchObject({ direction: true, within: true });
    expect(score(3.7, 1.36)).toMatchObject({ direction: true, within: false });
    // a small published effect is not passed by a flat result: 1.18x against 1.02x
    expect(score(1.18, 1.02)).toMatchObject({ direction: true, within: false });
    expect(score(1.73, 0.98)).toMatchObject({ direction: false, within: false });
    // "about the same": ours must be flat too
    expect(score(1, 1.04)).toMatchObject({ direction: true, within: true, effect: null });
    expect(score(1, 1.3)).toMatchObject({ direction: false, within: false });
  });

  it('counts fetches as fetches (0 stays 0) and re-pulls after the first turn', () => {
    const multiturn = {
      config: { conversations: 60, turns: 5, concurrency: 12 },
      results: [
        { config: 'round_robin', prefillCrossNodeFetches: 41, dFullRepullsAfterFirst: 53, decodeFullRepulls: 113 },
        { config: 'pd_affinity', prefillCrossNodeFetches: 0, dFullRepullsAfterFirst: 2, decodeFullRepulls: 62 },
      ],
    };
    const rows = Object.fromEntries(scorecard({ multiturn }).map((r) => [r.n, r]));
    expect(rows[13].ours).toMatchObject({ a: 41, b: 0 });
    expect(rows[13].oursRatio).toBe('inf');
    expect(rows[13].direction).toBe(true);
    expect(rows[13].within).toBe(false);
    expect(rows[12].ours).toMatchObject({ a: 53, b: 2 });
    expect(rows[1].ours).toBeUndefined();
    expect(scorecard({}).length).toBe(25);
  });
});

describe('docs/benchmark-seeds.md', () => {
  it('holds the table generated from bench/results/seeds.json', () => {
    const card = JSON.parse(readFileSync(SEEDS_JSON, 'utf8'));
    const doc = readFileSync(SEEDS_DOC, 'utf8');
    expect(doc).toContain(DOC_BEGIN);
    expect(generatedPart(doc)).toBe(scorecardMarkdown(card).trim());
    expect(generatedPart(spliceGenerated(doc, 'x'))).toBe('x');
  });
});

describe('several runs side by side (seeds-spread, issue 22 item 5)', () => {
  /** @param {number} n @param {number | null} ours @param {boolean} direction */
  const row = (n, ours, direction) => ({
    n,
    what: `row ${n}`,
    publishedRatio: 1.5,
    oursRatio: ours,
    ours: ours === null ? null : { a: 1, b: 1 },
    direction,
    within: false,
    fitted: [],
  });
  it('names the comparisons whose direction changes between runs, and counts each run', () => {
    const s = spread([
      { label: 'quiet-1', rows: [row(1, 1.2, true), row(2, 0.98, false), row(3, null, false)], loadAverage: [1, 1, 1] },
      { label: 'busy', rows: [row(1, 1.1, true), row(2, 1.03, true), row(3, null, false)], loadAverage: [4, 3, 2] },
    ]);
    expect(s.changed).toEqual([2]);
    expect(s.stable).toBe(2); // a comparison no run has is not a change
    expect(s.rows[0]).toMatchObject({ min: 1.1, max: 1.2, directions: [true, true], stable: true });
    expect(s.rows[2].directions).toEqual([null, null]);
    expect(s.runs.map((r) => r.direction)).toEqual([1, 2]);
    const md = spreadMarkdown(s);
    expect(md).toContain('2 of 3 comparisons point the same way in all 2 runs; changed: #2.');
    expect(md).toContain('| 2 | row 2 | 1.5x | 0.98x NO | 1.03x yes | NO | 1.005x yes |');
  });
  it('pools each ratio over the runs (geometric mean) and scores the pooled ratio as one run', () => {
    // 1.2x and 1.875x against 1.5x published: each run 0.55 off on effect size, their mean on it
    const inf = row(2, /** @type {any} */ ('inf'), true);
    const s = spread([
      { label: 'trace-1', rows: [row(1, 1.2, true), inf, row(3, 0.9, false)] },
      { label: 'trace-2', rows: [row(1, 1.875, true), inf, row(3, null, false)] },
    ]);
    expect(s.runs.map((r) => r.within)).toEqual([0, 0]);
    expect(s.rows[0].pooled).toEqual({ ratio: 1.5, direction: true, within: true });
    // a count of 0 below a ratio is not pooled: the published way only if every run's is
    expect(s.rows[1].pooled).toEqual({ ratio: null, direction: true, within: false });
    // nor a comparison one run lacks
    expect(s.rows[2].pooled).toEqual({ ratio: null, direction: false, within: false });
    expect(s.pooled).toEqual({ direction: 2, within: 1 });
    const md = spreadMarkdown(s);
    expect(md).toContain("| pooled (each ratio's geometric mean over the runs) | - | 2 | 1 |");
    expect(md).toContain('| 1 | row 1 | 1.5x | 1.2x yes | 1.875x yes | yes | 1.5x yes, within |');
    expect(md).toContain('| 2 | row 2 | 1.5x | ∞x yes | ∞x yes | yes | - yes |');
  });
});

describe('docs/benchmark-seeds.md, its Host load part', () => {
  it('is the committed seeds-spread.json, as `npm run bench -- seeds-spread` writes it', () => {
    const doc = readFileSync(SEEDS_DOC, 'utf8');
    const committed = JSON.parse(readFileSync(SEEDS_JSON.replace('seeds.json', 'seeds-spread.json'), 'utf8'));
    expect(generatedPart(doc, SPREAD_BEGIN, SPREAD_END)).toBe(spreadMarkdown(committed).trim());
  });
});

describe('the figures judged on their own', () => {
  it("count a wait for decode KV at the router's edge (its KV guard) beside one inside the engines", () => {
    const agentic = {
      results: [
        { name: 'pd-6p2d/cache_aware', kvWaitShare: 0.02, edgeWaitShare: 0.57, edgeQueued: 84, completed: 1000, edgeQueueP90Ms: 173575, decodeKvPeak: 0.9, decodeKvMean: 0.41 },
      ],
    };
    const row = diagnostics({ agentic }).find((d) => d.what.includes('main run') && d.what.includes('waiting for decode KV'));
    expect(row?.ours).toBe('0.02 + 0.57 (84 of 1000 requests held at the edge, p90 173.575 s)');
    expect(row?.what).toContain('the router reading engine signals');
  });

  it("say when the row was run as the study's scheduler, reading no engine signals", () => {
    const agentic = { results: [{ name: 'pd-6p2d/cache_aware', engineSignals: false, kvWaitShare: 0.53, edgeWaitShare: 0, edgeQueued: 0, completed: 1000, edgeQueueP90Ms: 0 }] };
    const row = diagnostics({ agentic }).find((d) => d.what.includes('main run') && d.what.includes('waiting for decode KV'));
    expect(row?.what).toContain('reading no engine signals, as the study');
    expect(row?.ours).toBe('0.53 + 0 (0 of 1000 requests held at the edge, p90 0 s)');
  });
});
