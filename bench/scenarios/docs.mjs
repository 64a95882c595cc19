// `npm run bench -- docs`: rebuilds every results block of docs/benchmark-results.md (and of
// docs/benchmark.md, which has none since the split) from the committed JSON in bench/results/
// (issue 26: tables of numbers are generated, never typed twice). A block is the lines between
//   <!-- generated from bench/results/X.json by npm run bench -- docs: do not edit by hand -->
//   <!-- end of generated X -->
// and holds the command that made X.json, when it finished and the machine's load then, and the
// tables the scenario printed, rebuilt by the scenario's own table code. Runs nothing itself.
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { stringOption } from '../lib/args.mjs';
import { agenticMarkdown } from './agentic.mjs';
import { doCapacityTable } from './do-capacity.mjs';
import { groupsTable } from './groups.mjs';
import { multiturnMarkdown } from './multiturn.mjs';
import { overheadTables } from './overhead.mjs';
import { soakTable } from './soak.mjs';
import { tiersTable } from './tiers.mjs';
import { traceMarkdown } from './trace.mjs';

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
export const BENCHMARK_DOC = path.join(REPO, 'docs', 'benchmark.md');
/** each scenario's section with its committed run's tables (split from benchmark.md) */
export const BENCHMARK_RESULTS_DOC = path.join(REPO, 'docs', 'benchmark-results.md');
/** the pages whose results blocks `npm run bench -- docs` rebuilds */
export const BENCHMARK_DOCS = [BENCHMARK_DOC, BENCHMARK_RESULTS_DOC];
export const RESULTS_DIR = path.join(REPO, 'bench', 'results');

/** A scenario's tables from its report, by the report's `scenario`. */
const TABLES = /** @type {Record<string, (report: any) => string>} */ ({
  multiturn: multiturnMarkdown,
  agentic: agenticMarkdown,
  trace: traceMarkdown,
  groups: groupsTable,
  overhead: overheadTables,
  'do-capacity': doCapacityTable,
  soak: soakTable,
  tiers: tiersTable,
});

const BLOCK = /<!-- generated from bench\/results\/([\w.-]+)\.json by npm run bench -- docs: do not edit by hand -->\n[\s\S]*?<!-- end of generated \1 -->/g;

/**
 * A block's contents: where the JSON came from, then its tables.
 * @param {string} name the JSON's basename, without `.json`
 * @param {any} report the JSON
 * @param {string | undefined} command the command that wrote it (the first line of the .md beside it)
 */
export function resultsBlock(name, report, command) {
  const tables = TABLES[report.scenario];
  if (!tables) throw new Error(`bench/results/${name}.json: no table for scenario ${report.scenario}`);
  const load = report.machine?.loadAverage ? `, load average ${report.machine.loadAverage.join(' / ')} on ${report.machine.cpus} cores` : '';
  const source = `From \`bench/results/${name}.json\`, written by \`${command ?? `npm run bench -- ${report.scenario}`}\` (finished ${report.finishedAt}${load}).`;
  return `${source}\n\n${tables(report).trim()}`;
}

/**
 * The document with every generated block rebuilt.
 * @param {string} doc
 * @param {(name: string) => { report: any, command?: string }} read a results file by basename
 */
export function regenerate(doc, read) {
  return doc.replace(BLOCK, (_, /** @type {string} */ name) => {
    const { report, command } = read(name);
    return `${beginMarker(name)}\n\n${resultsBlock(name, report, command)}\n\n<!-- end of generated ${name} -->`;
  });
}

/** @param {string} name */
export const beginMarker = (name) => `<!-- generated from bench/results/${name}.json by npm run bench -- docs: do not edit by hand -->`;

/** The basenames of the blocks in `doc`, in order. @param {string} doc */
export function blockNames(doc) {
  return [...doc.matchAll(BLOCK)].map((m) => m[1]);
}

/** Reads `dir/NAME.json` and the command on the first line of `dir/NAME.md`. @param {string} dir */
export function resultsReader(dir) {
  return (/** @type {string} */ name) => {
    const report = JSON.parse(readFileSync(path.join(dir, `${name}.json`), 'utf8'));
    const md = path.join(dir, `${name}.md`);
    const command = existsSync(md) ? /^`([^`]+)`/.exec(readFileSync(md, 'utf8'))?.[1] : undefined;
    return { report, command };
  };
}

/** @param {Record<string, string | true>} options */
export async function runDocs(options) {
  const dir = stringOption(options, 'dir') ?? RESULTS_DIR;
  const lines = BENCHMARK_DOCS.map((file) => {
    const doc = readFileSync(file, 'utf8');
    const next = regenerate(doc, resultsReader(dir));
    if (next !== doc) writeFileSync(file, next);
    const names = blockNames(next);
    return `docs/${path.basename(file)}: ${names.length} results blocks${names.length ? ` (${names.join(', ')})` : ''}, ${next === doc ? 'unchanged' : 'rewritten'}`;
  });
  return { table: lines.join('\n') };
}
