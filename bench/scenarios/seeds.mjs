// `npm run bench -- seeds`: the seeds' scorecard (issue 22) from the headline runs' JSON in
// bench/results/ (multiturn, agentic, its ablation and breakdown runs; the command that made each
// is in the .md beside it). Writes bench/results/seeds.json and the generated part of
// docs/benchmark-seeds.md. Runs nothing itself: a headline run takes minutes, this a second.
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { stringOption } from '../lib/args.mjs';
import { RUN_FILES, SPREAD_BEGIN, SPREAD_END, diagnostics, scorecard, scorecardMarkdown, spliceGenerated, spread, spreadMarkdown, summary } from '../lib/scorecard.mjs';

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
export const SEEDS_JSON = path.join(REPO, 'bench', 'results', 'seeds.json');
export const SEEDS_DOC = path.join(REPO, 'docs', 'benchmark-seeds.md');

/**
 * The scorecard of the runs in `dir`.
 * @param {string} dir
 */
export function buildScorecard(dir) {
  /** @type {Record<string, any>} */
  const runs = {};
  /** @type {Record<string, string>} */
  const sources = {};
  for (const [k, file] of Object.entries(RUN_FILES)) {
    const p = path.join(dir, file);
    if (!existsSync(p)) continue;
    runs[k] = JSON.parse(readFileSync(p, 'utf8'));
    const md = p.replace(/\.json$/, '.md');
    const command = existsSync(md) ? (/^`([^`]+)`/.exec(readFileSync(md, 'utf8'))?.[1] ?? file) : file;
    sources[k] = `${path.relative(REPO, p)} (\`${command}\`)`;
  }
  const rows = scorecard(runs);
  return { rows, diagnostics: diagnostics(runs), summary: summary(rows), sources };
}

/** @param {Record<string, string | true>} options */
export async function runSeeds(options) {
  const dir = stringOption(options, 'dir') ?? path.join(REPO, 'bench', 'results');
  // through JSON, as the test reads it back: the document is what the JSON says
  const card = JSON.parse(JSON.stringify(buildScorecard(dir)));
  const markdown = scorecardMarkdown(card);
  if (options['no-doc'] !== true && existsSync(SEEDS_DOC)) writeFileSync(SEEDS_DOC, spliceGenerated(readFileSync(SEEDS_DOC, 'utf8'), markdown));
  return {
    defaultJson: SEEDS_JSON,
    report: { scenario: 'seeds', ...card, results: card.rows },
    table: markdown,
    chart: {
      title: 'seeds: published ratio vs ours (log scale would be fairer; raw ratios shown)',
      series: card.rows.map((r) => `#${r.n}`),
      figures: [
        { name: 'published ratio', values: card.rows.map((r) => r.publishedRatio) },
        { name: 'ours', values: card.rows.map((r) => (r.oursRatio !== null && Number.isFinite(r.oursRatio) ? r.oursRatio : 0)) },
      ],
    },
  };
}

/**
 * `npm run bench -- seeds-spread --dirs A,B,... [--labels a,b,...] [--no-doc]`: the scorecards of
 * several directories of runs (scripts/seeds-runs.sh) side by side: which comparisons change
 * direction between them (issue 22, item 5). Writes the "Host load" part of
 * docs/benchmark-seeds.md unless --no-doc. Runs nothing itself.
 * @param {Record<string, string | true>} options
 */
export async function runSeedsSpread(options) {
  const dirs = (stringOption(options, 'dirs') ?? '').split(',').filter(Boolean);
  if (dirs.length < 2) throw new Error('seeds-spread: --dirs A,B[,...] (directories of scripts/seeds-runs.sh) is required');
  const labels = (stringOption(options, 'labels') ?? '').split(',').filter(Boolean);
  const runs = dirs.map((dir, i) => {
    const card = buildScorecard(dir);
    // the machine's load at the end of each of the four runs: the highest
    const loads = Object.values(RUN_FILES)
      .map((f) => path.join(dir, f))
      .filter((p) => existsSync(p))
      .map((p) => JSON.parse(readFileSync(p, 'utf8')).machine?.loadAverage)
      .filter(Array.isArray);
    const loadAverage = loads.length ? [0, 1, 2].map((k) => Math.max(...loads.map((l) => l[k]))) : undefined;
    return { label: labels[i] ?? path.basename(dir), rows: card.rows, loadAverage };
  });
  const s = spread(runs);
  const markdown = spreadMarkdown(s);
  // the committed spread is part of the seeds' document (its "Host load" section); --no-doc for others
  if (options['no-doc'] !== true && existsSync(SEEDS_DOC)) writeFileSync(SEEDS_DOC, spliceGenerated(readFileSync(SEEDS_DOC, 'utf8'), markdown, SPREAD_BEGIN, SPREAD_END));
  return {
    defaultJson: path.join(REPO, 'bench', 'results', 'seeds-spread.json'),
    report: { scenario: 'seeds-spread', dirs, ...s, results: s.rows },
    table: markdown,
    chart: {
      title: 'seeds-spread: ours per run (raw ratios)',
      series: s.rows.map((r) => `#${r.n}`),
      figures: runs.map((r, i) => ({ name: r.label, values: s.rows.map((row) => (row.ours[i] !== null && Number.isFinite(row.ours[i]) ? row.ours[i] : 0)) })),
    },
  };
}
