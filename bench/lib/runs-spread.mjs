// Several runs of one scenario side by side (`npm run bench -- runs-spread`): each row's figures
// over the runs (median, lowest, highest) and, paired inside each run, its ratio to a baseline row
// of that run — how many runs it was at or better than the baseline. A single agentic run of the
// `predicted` rows moves by 10-20 % between runs (docs/predicted.md); one run cannot tell a lever
// from noise, several runs judged this way can. Pure: the scenario reads the files.
import { percentile, round } from './stats.mjs';

/**
 * The figures compared, per scenario: the result's key, its label, and whether lower is better.
 * @type {Record<string, Array<{ key: string, label: string, lowerIsBetter: boolean }>>}
 */
export const SPREAD_METRICS = {
  agentic: [
    { key: 'ttftP50Ms', label: 'TTFT p50 ms', lowerIsBetter: true },
    { key: 'ttftP90Ms', label: 'TTFT p90 ms', lowerIsBetter: true },
    { key: 'tpotP90Ms', label: 'TPOT p90 ms', lowerIsBetter: true },
    { key: 'itlP99Ms', label: 'ITL p99 ms', lowerIsBetter: true },
    { key: 'hitRatio', label: 'APC', lowerIsBetter: false },
    { key: 'decodeKvPeak', label: 'decode KV peak', lowerIsBetter: true },
    // predicted rows: the share of requests whose TTFT was within 25% of the prediction
    { key: 'predictionRatio.within25', label: 'prediction within 25%', lowerIsBetter: false },
  ],
  multiturn: [
    { key: 'outTokPerS', label: 'out tok/s', lowerIsBetter: false },
    { key: 'itlP99Ms', label: 'ITL p99 ms', lowerIsBetter: true },
    { key: 'tpotP99Ms', label: 'TPOT p99 ms', lowerIsBetter: true },
    { key: 'ttftP50Ms', label: 'TTFT p50 ms', lowerIsBetter: true },
  ],
};

/** @param {number[]} xs sorted or not; the middle value (the mean of the two middle ones) */
export function median(xs) {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

/** @param {any} row a result row of agentic (`name`) or multiturn (`config`) */
const rowName = (row) => String(row.name ?? row.config);

/** A figure of a row by its key (`a.b` reads a nested one); null when absent or not a number. @param {any} row @param {string} key */
const figure = (row, key) => {
  const v = key.split('.').reduce((o, k) => (o == null ? undefined : o[k]), row);
  return typeof v === 'number' && Number.isFinite(v) ? v : null;
};

/**
 * @param {Array<{ label: string, report: { scenario: string, results: any[] } }>} runs
 * @param {string} baseline the row every other is paired with, inside each run
 */
export function runsSpread(runs, baseline) {
  if (runs.length < 2) throw new Error('runs-spread: two runs at least');
  const scenario = runs[0].report.scenario;
  const metrics = SPREAD_METRICS[scenario];
  if (!metrics) throw new Error(`runs-spread: ${scenario} runs are not compared (${Object.keys(SPREAD_METRICS).join(', ')} are)`);
  for (const r of runs) if (r.report.scenario !== scenario) throw new Error(`runs-spread: ${r.label} is a ${r.report.scenario} run, the first a ${scenario} run`);
  /** @type {string[]} */
  const names = [];
  for (const r of runs) for (const row of r.report.results) if (!names.includes(rowName(row))) names.push(rowName(row));
  if (!names.includes(baseline)) throw new Error(`runs-spread: no row ${baseline} in any run (rows: ${names.join(', ')})`);
  const rowOf = (/** @type {string} */ name) => runs.map((r) => r.report.results.find((row) => rowName(row) === name));
  const bases = rowOf(baseline);
  const rows = names.map((name) => {
    const each = rowOf(name);
    return {
      name,
      runs: each.filter(Boolean).length,
      metrics: metrics.map((m) => {
        const values = each.map((row) => (row ? figure(row, m.key) : null));
        const present = /** @type {number[]} */ (values.filter((v) => v !== null));
        // paired: this row over the baseline of the same run, in runs that have both
        const ratios = values.map((v, i) => {
          const b = bases[i] ? figure(bases[i], m.key) : null;
          return v !== null && b !== null && b > 0 ? v / b : null;
        });
        const paired = /** @type {number[]} */ (ratios.filter((x) => x !== null));
        return {
          key: m.key,
          label: m.label,
          values,
          median: present.length ? round(median(present)) : null,
          min: present.length ? Math.min(...present) : null,
          max: present.length ? Math.max(...present) : null,
          ratios: ratios.map((x) => (x === null ? null : round(x))),
          ratioMedian: paired.length ? round(median(paired)) : null,
          ratioMin: paired.length ? round(Math.min(...paired)) : null,
          ratioMax: paired.length ? round(Math.max(...paired)) : null,
          // at or better than the baseline of its run: at or below it, or at or above when higher is better
          atOrBetter: paired.filter((x) => (m.lowerIsBetter ? x <= 1 : x >= 1)).length,
          paired: paired.length,
        };
      }),
    };
  });
  return { scenario, baseline, runs: runs.map((r) => r.label), rows, pooled: pooledTtft(runs, names, baseline) };
}

/**
 * TTFT p50 / p90 over every request of every run that recorded them (agentic's `ttftsMs`), each
 * row against the baseline pooled over the same runs: a percentile of a few thousand requests in
 * place of the median of per-run percentiles of a few hundred, which move in steps. Null when the
 * baseline's runs carry no per-request TTFTs (runs made before the field).
 * @param {Array<{ label: string, report: { scenario: string, results: any[] } }>} runs @param {string[]} names @param {string} baseline
 */
function pooledTtft(runs, names, baseline) {
  const ttfts = (/** @type {string} */ name, /** @type {number[]} */ within) => within.flatMap((i) => runs[i].report.results.find((row) => rowName(row) === name)?.ttftsMs ?? []);
  const withTtfts = (/** @type {string} */ name) => runs.flatMap((r, i) => (Array.isArray(r.report.results.find((row) => rowName(row) === name)?.ttftsMs) ? [i] : []));
  const baseRuns = withTtfts(baseline);
  if (baseRuns.length === 0) return null;
  return names.map((name) => {
    // the runs where both this row and the baseline recorded their requests' TTFTs
    const both = withTtfts(name).filter((i) => baseRuns.includes(i));
    const mine = ttfts(name, both);
    const base = ttfts(baseline, both);
    const at = (/** @type {number} */ p) => {
      const v = mine.length ? percentile(mine, p) : null;
      const b = base.length ? percentile(base, p) : null;
      return { ms: v === null ? null : round(v, 1), ratio: v !== null && b !== null && b > 0 ? round(v / b) : null };
    };
    return { name, runs: both.length, requests: mine.length, p50: at(50), p90: at(90) };
  });
}

/** @param {ReturnType<typeof runsSpread>} s */
export function runsSpreadMarkdown(s) {
  const num = (/** @type {number | null} */ x) => (x === null ? '-' : x >= 100 ? String(Math.round(x)) : String(round(x, 3)));
  const lines = [
    `${s.runs.length} ${s.scenario} runs (${s.runs.join(', ')}); each row's median (lowest-highest) over the runs that have it, and its ratio to ${s.baseline} of the same run: median (lowest-highest), and in how many runs it was at or better than it.`,
    '',
    `| row | runs | ${s.rows[0].metrics.map((m) => m.label).join(' | ')} |`,
    `|---|---|${s.rows[0].metrics.map(() => '---|').join('')}`,
  ];
  for (const r of s.rows) {
    lines.push(`| ${r.name} | ${r.runs} | ${r.metrics.map((m) => (m.median === null ? '-' : `${num(m.median)} (${num(m.min)}-${num(m.max)})`)).join(' | ')} |`);
  }
  lines.push('', `| row / ${s.baseline} | ${s.rows[0].metrics.map((m) => m.label).join(' | ')} |`, `|---|${s.rows[0].metrics.map(() => '---|').join('')}`);
  for (const r of s.rows) {
    if (r.name === s.baseline) continue;
    lines.push(
      `| ${r.name} | ${r.metrics.map((m) => (m.paired ? `${m.ratioMedian}x (${m.ratioMin}-${m.ratioMax}), ${m.atOrBetter} of ${m.paired} at or better` : '-')).join(' | ')} |`,
    );
  }
  if (s.pooled) {
    lines.push(
      '',
      `Pooled over every request of the runs that recorded them (each row with ${s.baseline} of the same runs): TTFT p50 and p90 ms, and the ratio to ${s.baseline}.`,
      '',
      `| row | runs | requests | TTFT p50 ms | TTFT p90 ms |`,
      '|---|---|---|---|---|',
    );
    for (const r of s.pooled) {
      const cell = (/** @type {{ ms: number | null, ratio: number | null }} */ x) => (x.ms === null ? '-' : r.name === s.baseline ? num(x.ms) : `${num(x.ms)} (${x.ratio}x)`);
      lines.push(`| ${r.name} | ${r.runs} | ${r.requests} | ${cell(r.p50)} | ${cell(r.p90)} |`);
    }
  }
  return lines.join('\n');
}
