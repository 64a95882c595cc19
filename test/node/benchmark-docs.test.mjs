// docs/benchmark-results.md's results blocks (and any in docs/benchmark.md) are generated from the
// committed JSON in bench/results/ by `npm run bench -- docs` (issue 26): a new run committed without regenerating, or a hand edit
// inside a block, fails here until the page says what the JSON says.
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { BENCHMARK_DOC, BENCHMARK_DOCS, BENCHMARK_RESULTS_DOC, RESULTS_DIR, beginMarker, blockNames, regenerate, resultsReader } from '../../bench/scenarios/docs.mjs';

const doc = readFileSync(BENCHMARK_DOC, 'utf8');
const read = resultsReader(RESULTS_DIR);

describe("docs/benchmark-results.md holds the scenarios' tables", () => {
  it('one generated block a committed run, the agentic and trace runs among them', () => {
    const names = blockNames(readFileSync(BENCHMARK_RESULTS_DOC, 'utf8'));
    expect(names).toContain('agentic');
    expect(names).toContain('trace-8');
    expect(names.length).toBeGreaterThan(10);
  });
});

describe.each(BENCHMARK_DOCS.map((file) => [path.relative(path.join(RESULTS_DIR, '..', '..'), file), file]))('%s: the results tables are the committed JSON', (_, file) => {
  const doc = readFileSync(file, 'utf8');

  it('every generated block is what npm run bench -- docs writes from bench/results/', () => {
    // compared block by block, so a failure names the block that is out of date
    const regenerated = regenerate(doc, read);
    for (const name of blockNames(doc)) {
      const of = (/** @type {string} */ text) => text.slice(text.indexOf(beginMarker(name)), text.indexOf(`<!-- end of generated ${name} -->`));
      expect(of(doc), `bench/results/${name}.json: run npm run bench -- docs`).toBe(of(regenerated));
    }
    expect(regenerated).toBe(doc);
  });

  it('each block says which command wrote its JSON and when', () => {
    for (const name of blockNames(doc)) {
      const { report, command } = read(name);
      const block = doc.slice(doc.indexOf(beginMarker(name)));
      expect(block).toContain(`written by \`${command}\``);
      expect(block).toContain(`finished ${report.finishedAt}`);
    }
  });

  it('regenerating is idempotent', () => {
    const once = regenerate(doc, read);
    expect(regenerate(once, read)).toBe(once);
  });

  it('a hand edit inside a block is undone, text outside the blocks is kept', () => {
    const [name] = blockNames(readFileSync(BENCHMARK_RESULTS_DOC, 'utf8'));
    const edited = `intro kept\n\n${beginMarker(name)}\n\n| a hand-typed | table |\n\n<!-- end of generated ${name} -->\n\noutro kept\n`;
    const out = regenerate(edited, read);
    expect(out).not.toContain('hand-typed');
    expect(out.startsWith('intro kept\n\n')).toBe(true);
    expect(out.endsWith('\n\noutro kept\n')).toBe(true);
  });

  it('the page has no results table left outside a generated block from the runs it names', () => {
    // the hand-copied tables this page used to hold began with these headers
    const outside = doc.replace(/<!-- generated from [\s\S]*?<!-- end of generated [\w.-]+ -->/g, '');
    for (const header of ['| config | nodes (clients) |', '| pdGroup |', '| policy | hit ratio |', '| policy | conc. |', '| op | policy |']) {
      expect(outside).not.toContain(header);
    }
  });
});

describe("docs/benchmark.md's 'Results in short': the figures it quotes are the committed JSON", () => {
  const json = (/** @type {string} */ name) => JSON.parse(readFileSync(path.join(RESULTS_DIR, `${name}.json`), 'utf8'));
  /** The claims table's row that starts with `what`. @param {string} what */
  const row = (what) => doc.split('\n').find((line) => line.startsWith(`| ${what}`)) ?? '';
  const f3 = (/** @type {number} */ x) => x.toFixed(3);
  const range = (/** @type {number[]} */ xs, digits = 1) => `${Math.min(...xs).toFixed(digits)}-${Math.max(...xs).toFixed(digits)}`;

  it('trace, 8 nodes: cache_aware share of the ceiling and balance, and the three policies hit ratios', () => {
    const t = json('trace-8');
    const by = Object.fromEntries(t.results.map((/** @type {any} */ r) => [r.policy, r]));
    const ca = by.cache_aware;
    expect(row('trace, 8 nodes')).toContain(`${f3(ca.hitRatio)} of ${f3(t.ceiling)} (${f3(ca.ofCeiling)}), max/mean ${f3(ca.maxOverMeanTokens)} in prefill tokens`);
    expect(row('trace: work balanced')).toContain(`after: ${f3(ca.maxOverMeanTokens)}`);
    expect(row('trace: cache_aware above')).toContain(`cache_aware ${f3(ca.hitRatio)}, affinity ${f3(by.affinity.hitRatio)}, round_robin ${f3(by.round_robin.hitRatio)}`);
  });

  it('trace with a restart: predicted over reported, with and without feedback, and the restarted node', () => {
    const [small, large] = ['trace-restart', 'trace-restart-5000'].map((n) => json(n).results);
    const line = row('trace with evictions');
    expect(line).toContain(`${f3(large[0].predictedOverReported)} (5,000 blocks) and ${small[0].predictedOverReported.toFixed(2)} (1,000: evictions) with feedback`);
    expect(line).toContain(`${f3(large[1].predictedOverReported)} and ${small[1].predictedOverReported.toFixed(2)} without`);
    expect(line).toContain(`its predictions ${f3(large[0].afterRestart.node.predictedOverReported)} after, ${large[1].afterRestart.node.predictedOverReported.toFixed(2)} without`);
    expect(line).toContain(`(${f3(large[0].hitRatio)} / ${f3(large[1].hitRatio)})`);
  });

  it("agentic: the lever's hit ratio and TTFT, and 6P+2D's decode KV peak, waits and mean against the closed loop's ceiling", () => {
    const by = Object.fromEntries(json('agentic').results.map((/** @type {any} */ r) => [r.name, r]));
    const [ca, rr, pd] = [by['colocated-8/cache_aware'], by['colocated-8/round_robin'], by['pd-6p2d/cache_aware']];
    const line = row('agentic (seed 002)');
    expect(line).toContain(`APC ${f3(ca.hitRatio)} against ${f3(rr.hitRatio)}, TTFT p50 ${(ca.ttftP50Ms / 1000).toFixed(2)} s against ${(rr.ttftP50Ms / 1000).toFixed(2)} s`);
    expect(pd.engineSignals).toBe(false);
    expect(line).toContain(`decode KV peaks at ${pd.decodeKvPeak.toFixed(1)} and ${Math.round(pd.kvWaitShare * 100)}% of its TTFT waits`);
    expect(line).toContain(`its mean is ${pd.decodeKvMean.toFixed(2)} (the closed loop of 8 sessions allows ${pd.decodeKvCeiling.mean.toFixed(2)})`);
  });

  it('overhead: CPU and memory against the baseline Worker, failures, legs closed, the decision cost', () => {
    const o = json('overhead');
    const levels = o.results.flatMap((/** @type {any} */ r) => r.levels);
    expect(row('proxy CPU')).toContain(`${range(levels.map((/** @type {any} */ l) => l.ratios.cpuVsBaseline))}x`);
    const at64 = levels.filter((/** @type {any} */ l) => l.concurrency === 64);
    expect(at64.every((/** @type {any} */ l) => l.router.failed === 0)).toBe(true);
    expect(row('requests failing')).toContain(`0 of ${at64[0].router.requests.toLocaleString('en-US')} per policy over ${o.config.rounds} rounds`);
    const routers = o.memory.filter((/** @type {any} */ m) => m.target !== 'baseline');
    const baseline = o.memory.find((/** @type {any} */ m) => m.target === 'baseline');
    expect(row('memory a stream')).toContain(
      `${range(
        routers.map((/** @type {any} */ m) => m.kbPerStream),
        0,
      )} KB vs ${Math.round(baseline.kbPerStream)} KB`,
    );
    const closed = (/** @type {string} */ k) =>
      range(
        routers.map((/** @type {any} */ m) => m[k] / 1000),
        2,
      );
    expect(row('client gone')).toContain(`all 1,000 in ${closed('upstreamClosedAllMs')} s, half in ${closed('upstreamClosedHalfMs')} s`);
    expect(row('cache_aware decision')).toContain(`+${o.decision.addedP50Ms.toFixed(2)} ms p50`);
  });
});
