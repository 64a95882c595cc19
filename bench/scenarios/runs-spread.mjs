// `npm run bench -- runs-spread --files A.json,B.json,... --baseline ROW [--labels a,b,...]`:
// several runs of one scenario (agentic or multiturn) side by side, each row paired with the
// baseline row of its own run (bench/lib/runs-spread.mjs). Runs nothing itself.
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { stringOption } from '../lib/args.mjs';
import { runsSpread, runsSpreadMarkdown } from '../lib/runs-spread.mjs';

/** @param {Record<string, string | true>} options */
export async function runRunsSpread(options) {
  const files = (stringOption(options, 'files') ?? '').split(',').filter(Boolean);
  if (files.length < 2) throw new Error('runs-spread: --files A.json,B.json[,...] (runs of one scenario) is required');
  const baseline = stringOption(options, 'baseline');
  if (!baseline) throw new Error('runs-spread: --baseline ROW (e.g. colocated-8/cache_aware, pd_affinity) is required');
  const labels = (stringOption(options, 'labels') ?? '').split(',').filter(Boolean);
  const runs = files.map((file, i) => ({ label: labels[i] ?? path.basename(file, '.json'), report: JSON.parse(readFileSync(file, 'utf8')) }));
  const s = runsSpread(runs, baseline);
  const table = runsSpreadMarkdown(s);
  const ttft = (/** @type {(typeof s.rows)[number]} */ r) => r.metrics[0];
  return {
    report: { scenario: 'runs-spread', of: s.scenario, files, baseline: s.baseline, runs: s.runs, results: s.rows, pooled: s.pooled },
    table,
    chart: {
      title: `runs-spread: ${s.rows[0].metrics[0].label}, each run (${s.scenario})`,
      series: s.rows.map((r) => r.name),
      figures: s.runs.map((label, i) => ({ name: label, values: s.rows.map((r) => ttft(r).values[i] ?? 0) })),
    },
  };
}
