// `npm run bench -- <scenario> [options]`: the simulated-cluster benchmark (SPEC section 7).
import { readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs, stringOption } from './lib/args.mjs';
import { workerSource } from './lib/harness.mjs';
import { svgPathFor, writeReport } from './lib/report.mjs';
import { barChartSvg } from './lib/svg.mjs';

const SCENARIOS = {
  multiturn: () => import('./scenarios/multiturn.mjs').then((m) => m.runMultiturn),
  agentic: () => import('./scenarios/agentic.mjs').then((m) => m.runAgentic),
  trace: () => import('./scenarios/trace.mjs').then((m) => m.runTrace),
  overhead: () => import('./scenarios/overhead.mjs').then((m) => m.runOverhead),
  groups: () => import('./scenarios/groups.mjs').then((m) => m.runGroups),
  'do-capacity': () => import('./scenarios/do-capacity.mjs').then((m) => m.runDoCapacity),
  abandoned: () => import('./scenarios/abandoned.mjs').then((m) => m.runAbandoned),
  'handle-retry': () => import('./scenarios/handle-retry.mjs').then((m) => m.runHandleRetry),
  seeds: () => import('./scenarios/seeds.mjs').then((m) => m.runSeeds),
  'seeds-spread': () => import('./scenarios/seeds.mjs').then((m) => m.runSeedsSpread),
  'runs-spread': () => import('./scenarios/runs-spread.mjs').then((m) => m.runRunsSpread),
  docs: () => import('./scenarios/docs.mjs').then((m) => m.runDocs),
  soak: () => import('./scenarios/soak.mjs').then((m) => m.runSoak),
  tiers: () => import('./scenarios/tiers.mjs').then((m) => m.runTiers),
};

const USAGE = `usage: npm run bench -- <scenario> [options]

scenarios:
  multiturn   seed 000 on the seed000 preset: 2P+2D vllm, 60 conversations x 5 turns (8192 + 2048 tokens a turn,
              128 out), concurrency 12; round_robin, P affinity, P+D affinity, a 1P+1D isolation baseline
  agentic     seed 002 on the seed002 preset: 1,000 requests of a sessioned agentic trace on 8 nodes,
              colocated (round_robin, cache_aware) and PD 4P+4D / 6P+2D (bench/scenarios/agentic-configs.json)
  trace       --trace FILE --nodes N [--cache-blocks 5000] [--protocol colocated|vllm] [--limit K] [--concurrency 16]
  overhead    router vs direct TTFB and throughput at concurrency 1,16,64; Worker memory with 1000 slow streams
  groups      2 groups x (2P+2D), affinity; --policy lists pdGroup modes (off,prefer,strict)
  do-capacity routed requests/s one ClusterState object sustains (route + finish), 8/64/512 nodes
  abandoned   prefill blocks held by requests whose client left after P answered: today (no release) vs the router
soak:       --minutes 5 --concurrency 48 --sample-s 5 --seed 25 --shares 0.3,0.4,0.15,0.15
            --target router|baseline|both --rate R (paced; default 20 for baseline and both) --allocator (tcmalloc through gdb, idle)
tiers:      --seconds 90 --load 2 --probe-seconds 30 --probe-concurrency 48 --unloaded-seconds 45 --unloaded-load 0.25
            --seed 23 --prompt-tokens 2048 --output-tokens 32 --decode-blocks 40 --prefill-ms-per-token 0.02
            --kv-busy 0.9 --queue-ms 5000 --max-queued 64 --priority-reserve 0 --quick
  handle-retry simulated TTFT of a D retry: re-run P for a fresh handle vs the plain body to D
  seeds       the scorecard: every published comparison of the seeds (25) against the headline runs in
              bench/results/ (multiturn, agentic, agentic-ablation, agentic-breakdown); writes
              bench/results/seeds.json and the table of docs/benchmark-seeds.md; runs nothing itself
  seeds-spread --dirs A,B,... [--labels a,b,...]: the scorecards of several directories of runs
              (scripts/seeds-runs.sh DIR [busy-loops]) side by side, which comparisons change direction, and each ratio pooled (geometric mean)
  runs-spread --files A.json,B.json,... --baseline ROW [--labels a,b,...]: several agentic or multiturn runs
              side by side: each row's median and range, and its ratio to ROW of the same run (in how many
              runs at or better); runs nothing itself
  docs        rebuilds the results blocks of docs/benchmark-results.md from bench/results/*.json; runs nothing itself
  chart       --json PATH: re-draw the SVG of an earlier run

common options:
  --policy a,b,...     round_robin,affinity,least_load,cache_aware (default: all)
  --json PATH          write results as JSON, and an SVG chart beside it (default bench/out/<scenario>.json)
  --time-scale X       real ms per simulated ms for the engines
  --concurrency N
  --runtime workerd|wrangler   workerd via Miniflare (default), or under \`wrangler dev\`
  --src COMMIT         build the Worker from a commit (e.g. HEAD) instead of the working tree
multiturn:  --conversations 60 --turns 5 --first-turn-tokens 8192 --turn-tokens 2048 --output-tokens 128
            --config round_robin,p_affinity,pd_affinity,cache_aware,pd_affinity_conditional,isolation_1p1d --quick
agentic:    --requests 1000 --max-inflight-sessions 8 --sessions-per-s 1 --seed 36 --config NAME,... --configs FILE --quick
            --parallel N (configurations at once, each in its own process)
both:       --preset seed000|seed002|default --engine key=value,... (engine options over the preset)
trace:      --cache-aware-alpha X --block-chars N (passed to policy.cacheAware)
            --restart NODE@SHARE (restart that engine once SHARE of the requests were sent)
            --feedback with|without|both (cache-hit feedback; without: the test-only TEST_CACHE_FEEDBACK=count_only)
            --cells 1,2,4 (each policy with the pool cut into that many cells: the document's \`cells\`, docs/scaling.md)
overhead:   --levels 1,16,64 --requests-per-level N --streams 1000 --stream-seconds 120 --no-memory --memory-only --prompt-chars N
            --decision-prompt-chars 120000 --decision-requests 200 --no-decision --rounds 3
            --output-tokens 8 --no-usage (streams that ask for no usage frame)
            --memory-policy a,b (default: every --policy) --router-vars KEY=VALUE,... --abort-share 0.05
soak:       --minutes 5 --concurrency 48 --sample-s 5 --seed 25 --shares 0.3,0.4,0.15,0.15
            --target router|baseline|both --rate R (paced; default 20 for baseline and both) --allocator (tcmalloc through gdb, idle)
tiers:      --seconds 90 --load 2 --probe-seconds 30 --probe-concurrency 48 --unloaded-seconds 45 --unloaded-load 0.25
            --seed 23 --prompt-tokens 2048 --output-tokens 32 --decode-blocks 40 --prefill-ms-per-token 0.02
            --kv-busy 0.9 --queue-ms 5000 --max-queued 64 --priority-reserve 0 --quick
do-capacity: --nodes 8,64,512 --policy round_robin,least_load,cache_aware --ops noop,route_finish[,request]
            --seconds 5 --clients 4 --batch 64 --parallel 16`;

const { scenario, options } = parseArgs(process.argv.slice(2));
// workerd (default): the Worker in workerd via Miniflare, measuring the router and not the dev
// proxy in front of it; wrangler: under `wrangler dev`, as a developer runs it.
process.env.BENCH_RUNTIME = stringOption(options, 'runtime') ?? process.env.BENCH_RUNTIME ?? 'workerd';
// --src HEAD (or any commit): measure the Worker as committed, not the working tree
const src = stringOption(options, 'src');
if (src) process.env.BENCH_SRC = src;
if (scenario === 'chart') {
  // re-draw the SVG of a JSON written earlier (it keeps its chart): `npm run bench -- chart --json PATH`
  const jsonPath = stringOption(options, 'json');
  if (!jsonPath) throw new Error('chart: --json PATH is required');
  const report = JSON.parse(readFileSync(jsonPath, 'utf8'));
  writeFileSync(svgPathFor(jsonPath), barChartSvg(report.chart));
  console.log(`wrote ${svgPathFor(jsonPath)}`);
  process.exit(0);
}
if (!scenario || options.help || !(scenario in SCENARIOS)) {
  console.log(USAGE);
  process.exit(scenario && !options.help ? 2 : 0);
}

const started = performance.now();
try {
  const run = await SCENARIOS[/** @type {keyof typeof SCENARIOS} */ (scenario)]();
  const { report, table, chart, defaultJson } = /** @type {{ report?: any, table: string, chart?: any, defaultJson?: string }} */ (await run(options));
  if (!report) {
    // a scenario that only writes documents (docs): nothing measured, no JSON to write
    console.log(table);
    process.exit(0);
  }
  const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
  const jsonPath = stringOption(options, 'json') ?? defaultJson ?? path.join(repo, 'bench', 'out', `${scenario}.json`);
  const seconds = Math.round((performance.now() - started) / 100) / 10;
  const written = writeReport(
    jsonPath,
    { ...report, elapsedS: seconds, runtime: process.env.BENCH_RUNTIME, machine: machineNote(), finishedAt: new Date().toISOString(), worker: workerSource(), chart },
    chart,
  );
  // the table as markdown beside the JSON, with the command that made it (RESULTS.md is built from these)
  writeFileSync(jsonPath.replace(/\.json$/i, '') + '.md', `\`npm run bench -- ${process.argv.slice(2).join(' ')}\` (${seconds} s)\n\n${table}\n`);
  console.log(table);
  console.log(`\n${scenario}: ${seconds} s in all; wrote ${written.json} and ${written.svg}`);
  process.exit(0);
} catch (error) {
  console.error(error instanceof Error ? (error.stack ?? error.message) : error);
  process.exit(1);
}

function machineNote() {
  return { node: process.version, platform: `${process.platform}-${process.arch}`, cpus: os.cpus().length, loadAverage: os.loadavg().map((x) => Math.round(x * 100) / 100) };
}
