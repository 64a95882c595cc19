import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { median, runsSpread, runsSpreadMarkdown } from '../../bench/lib/runs-spread.mjs';

// Several runs of one scenario judged together (`npm run bench -- runs-spread`): a lever is told
// from the run-to-run noise of the `predicted` rows by pairing each row with the baseline of its
// own run, over several runs.

const agentic = (/** @type {Array<[string, number, number]>} */ rows) => ({
  scenario: 'agentic',
  results: rows.map(([name, ttft, apc]) => ({ name, ttftP50Ms: ttft, ttftP90Ms: ttft * 8, tpotP90Ms: 75, itlP99Ms: 78, hitRatio: apc, decodeKvPeak: 0.7 })),
});
/** One labelled agentic run of rows [name, TTFT p50 ms, APC]. */
const agenticRun = (/** @type {string} */ label, /** @type {Array<[string, number, number]>} */ rows) => ({ label, report: agentic(rows) });

describe('runs-spread (pure)', () => {
  it('takes the median and range over the runs, and pairs each row with the baseline of its own run', () => {
    const runs = [
      agenticRun('a', [
        ['colocated', 700, 0.5],
        ['both', 770, 0.45],
      ]),
      agenticRun('b', [
        ['colocated', 600, 0.5],
        ['both', 660, 0.55],
      ]),
      // slower overall (a busy machine), and both ahead of colocated in it
      agenticRun('c', [
        ['colocated', 900, 0.5],
        ['both', 810, 0.5],
      ]),
    ];
    const s = runsSpread(runs, 'colocated');
    const both = s.rows.find((r) => r.name === 'both');
    const ttft = both.metrics.find((m) => m.key === 'ttftP50Ms');
    expect(ttft).toMatchObject({ median: 770, min: 660, max: 810, ratios: [1.1, 1.1, 0.9], ratioMedian: 1.1, ratioMin: 0.9, ratioMax: 1.1, atOrBetter: 1, paired: 3 });
    // the raw medians would say 770 against 700 (1.1x); paired, it is also 1.1x, but one run in three was ahead
    // APC: higher is better, so at or above the baseline counts
    expect(both.metrics.find((m) => m.key === 'hitRatio')).toMatchObject({ ratios: [0.9, 1.1, 1], atOrBetter: 2 });
    const table = runsSpreadMarkdown(s);
    expect(table).toContain('| both | 3 | 770 (660-810) |');
    expect(table).toContain('1.1x (0.9-1.1), 1 of 3 at or better');
  });

  it('reads a nested figure (the prediction ratio of predicted rows), absent on other rows', () => {
    const run = (/** @type {number} */ within) => ({
      label: `w${within}`,
      report: {
        scenario: 'agentic',
        results: [
          { name: 'colocated', ttftP50Ms: 700 },
          { name: 'predicted', ttftP50Ms: 800, predictionRatio: { count: 300, within25: within, median: 1 } },
        ],
      },
    });
    const s = runsSpread([run(0.6), run(0.7)], 'colocated');
    const within = (/** @type {string} */ name) => s.rows.find((r) => r.name === name).metrics.find((m) => m.key === 'predictionRatio.within25');
    expect(within('predicted')).toMatchObject({ values: [0.6, 0.7], median: 0.65, paired: 0 });
    expect(within('colocated')).toMatchObject({ values: [null, null], median: null });
    expect(runsSpreadMarkdown(s)).toContain('0.65 (0.6-0.7)');
  });

  it('a row missing from a run is judged over the runs that have it', () => {
    const runs = [
      agenticRun('a', [
        ['colocated', 700, 0.5],
        ['pd', 900, 0.5],
      ]),
      agenticRun('b', [['colocated', 700, 0.5]]),
    ];
    const pd = runsSpread(runs, 'colocated').rows.find((r) => r.name === 'pd');
    expect(pd.runs).toBe(1);
    expect(pd.metrics[0]).toMatchObject({ values: [900, null], median: 900, ratios: [1.286, null], paired: 1 });
  });

  it('refuses one run, runs of different scenarios, a scenario it does not compare, and an unknown baseline', () => {
    const run = agenticRun('a', [['colocated', 700, 0.5]]);
    expect(() => runsSpread([run], 'colocated')).toThrow(/two runs at least/);
    expect(() => runsSpread([run, { label: 'm', report: { scenario: 'multiturn', results: [] } }], 'colocated')).toThrow(/m is a multiturn run/);
    expect(() => runsSpread([{ label: 't', report: { scenario: 'tiers', results: [] } }, run], 'colocated')).toThrow(/tiers runs are not compared/);
    expect(() => runsSpread([run, run], 'nope')).toThrow(/no row nope/);
  });

  it('pools every request of the runs that recorded them, each row against the baseline of the same runs', () => {
    const fill = (/** @type {number} */ n, /** @type {number} */ v) => Array.from({ length: n }, () => v);
    const run = (/** @type {string} */ label, /** @type {number[] | undefined} */ base, /** @type {number[] | undefined} */ both) => ({
      label,
      report: {
        scenario: 'agentic',
        results: [
          { name: 'colocated', ttftP50Ms: 1, ttftP90Ms: 1, ...(base ? { ttftsMs: base } : {}) },
          { name: 'both', ttftP50Ms: 1, ttftP90Ms: 1, ...(both ? { ttftsMs: both } : {}) },
        ],
      },
    });
    // per run (10 requests, p90 the 9th): 500 / 100 = 5x and 300 / 200 = 1.5x; pooled over the 20
    // (p90 the 18th, p50 the 10th): 500 / 200 = 2.5x and 200 / 200
    const a = run('a', [...fill(9, 100), 1000], [...fill(8, 100), 500, 1000]);
    const b = run('b', [...fill(9, 200), 2000], [...fill(8, 200), 300, 3000]);
    // a run made before the field, and one where only the baseline recorded them: left out of the pool
    const old = run('old', undefined, undefined);
    const half = run('half', fill(10, 5), undefined);
    const s = runsSpread([a, b, old, half], 'colocated');
    expect(s.pooled).toEqual([
      { name: 'colocated', runs: 3, requests: 30, p50: { ms: 100, ratio: 1 }, p90: { ms: 200, ratio: 1 } },
      { name: 'both', runs: 2, requests: 20, p50: { ms: 200, ratio: 1 }, p90: { ms: 500, ratio: 2.5 } },
    ]);
    expect(runsSpreadMarkdown(s)).toContain('| both | 2 | 20 | 200 (1x) | 500 (2.5x) |');
    // runs made before the field: no pooled figures
    expect(runsSpread([old, run('older', undefined, undefined)], 'colocated').pooled).toBeNull();
  });

  it('median of an even count is the mean of the middle two', () => {
    expect(median([4, 1, 3, 2])).toBe(2.5);
    expect(median([5])).toBe(5);
    expect(median([])).toBeNaN();
  });
});

describe('npm run bench -- runs-spread', () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'runs-spread-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('reads multiturn runs from the files named and writes the JSON and the table beside it', () => {
    const files = [560, 520].map((tok, i) => {
      const file = path.join(dir, `mt-${i}.json`);
      const row = (/** @type {string} */ config, /** @type {number} */ out, /** @type {number} */ itl) => ({
        config,
        outTokPerS: out,
        itlP99Ms: itl,
        tpotP99Ms: 21,
        ttftP50Ms: 300,
      });
      writeFileSync(file, JSON.stringify({ scenario: 'multiturn', results: [row('pd_affinity', 530, 40), row('pd_affinity_predicted', tok, 38 + 4 * i)] }));
      return file;
    });
    const out = path.join(dir, 'spread.json');
    const repo = path.resolve(path.dirname(new URL(import.meta.url).pathname), '../..');
    execFileSync(process.execPath, [path.join(repo, 'bench', 'run.mjs'), 'runs-spread', '--files', files.join(','), '--baseline', 'pd_affinity', '--json', out], { stdio: 'pipe' });
    const report = JSON.parse(readFileSync(out, 'utf8'));
    expect(report).toMatchObject({ scenario: 'runs-spread', of: 'multiturn', baseline: 'pd_affinity', runs: ['mt-0', 'mt-1'] });
    const predicted = report.results.find((r) => r.name === 'pd_affinity_predicted');
    // throughput: higher is better (560 and 520 against 530: one of two); ITL p99: 38 and 42 against 40
    expect(predicted.metrics.find((m) => m.key === 'outTokPerS')).toMatchObject({ atOrBetter: 1, paired: 2 });
    expect(predicted.metrics.find((m) => m.key === 'itlP99Ms')).toMatchObject({ ratios: [0.95, 1.05], atOrBetter: 1 });
    expect(readFileSync(out.replace(/\.json$/, '.md'), 'utf8')).toMatch(/^`npm run bench -- runs-spread --files /);
  });
});
