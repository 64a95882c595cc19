// Output of a scenario: a markdown table for people, JSON for machines, an SVG chart beside it.
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { barChartSvg } from './svg.mjs';

/**
 * @param {string[]} headers
 * @param {(string | number | boolean | null | undefined)[][]} rows
 */
export function markdownTable(headers, rows) {
  const cell = (/** @type {unknown} */ v) => (typeof v === 'number' ? formatNumber(v) : v === undefined || v === null ? '' : String(v));
  const lines = [`| ${headers.join(' | ')} |`, `|${headers.map(() => '---').join('|')}|`];
  for (const row of rows) lines.push(`| ${row.map(cell).join(' | ')} |`);
  return lines.join('\n');
}

/** @param {number} v */
export function formatNumber(v) {
  if (!Number.isFinite(v)) return 'n/a';
  if (Number.isInteger(v)) return String(v);
  if (Math.abs(v) >= 100) return v.toFixed(0);
  if (Math.abs(v) >= 10) return v.toFixed(1);
  return v.toFixed(3);
}

/** The SVG path beside a JSON path: same basename, `.svg`. @param {string} jsonPath */
export function svgPathFor(jsonPath) {
  return jsonPath.replace(/\.json$/i, '') + '.svg';
}

/**
 * Write `{ scenario, ...extra, results }` as JSON and the chart beside it.
 * @param {string} jsonPath
 * @param {{ scenario: string, results: Record<string, unknown>[], [k: string]: unknown }} report
 * @param {Parameters<typeof barChartSvg>[0]} chart
 * @returns {{ json: string, svg: string }}
 */
export function writeReport(jsonPath, report, chart) {
  mkdirSync(path.dirname(path.resolve(jsonPath)), { recursive: true });
  writeFileSync(jsonPath, JSON.stringify(report, null, 2) + '\n');
  const svg = svgPathFor(jsonPath);
  writeFileSync(svg, barChartSvg(chart));
  return { json: jsonPath, svg };
}
