// `agentic` (seed 002): a sessioned agentic trace (long prompts, short outputs, a shared system
// prompt; bench/lib/agentic-trace.mjs) on 8 simulated H20 engines serving Qwen3-Coder-30B-A3B
// (the seed002 preset), colocated or disaggregated (vLLM + Mooncake), per configuration of
// bench/scenarios/agentic-configs.json. Sessions arrive as a Poisson process; a multi-turn
// session sends its next turn after the previous answer plus a tool's run time.
//
// What limits this workload is decode KV memory: a D node holds the whole prompt of every request
// it runs (and, with Mooncake, takes the blocks as soon as the request arrives, before P is done),
// so with few D nodes requests queue for KV memory. Figures per configuration: TTFT p50/p90, TPOT
// p90, E2E p50 (the engines' simulated figures: P's queue and prefill, D's wait for KV memory,
// pull and decode; the router's time between legs is not in them), the prefix hit ratio as the
// engines count it (P's, or the colocated nodes'), decode KV use peak and mean, and the share of
// TTFT spent waiting for KV memory.
//
// Time: --time-scale real ms per simulated ms (0.05 by default: a run of about ten simulated
// minutes takes half a real one); the router's real time per request shows in the report.
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import http from 'node:http';
import { engineOverrides, numberOption, stringOption } from '../lib/args.mjs';
import { AGENTIC_SEED, agenticProfile, agenticTrace } from '../lib/agentic-trace.mjs';
import { startStack } from '../lib/harness.mjs';
import { postJson } from '../lib/http-client.mjs';
import { markdownTable } from '../lib/report.mjs';
import { SEED002, compareRatio, comparisonsTable } from '../lib/seeds.mjs';
import { mean, percentile, round } from '../lib/stats.mjs';
import { promptOfTraceRequest } from '../lib/trace.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));

/**
 * @typedef {object} AgenticConfig
 * @property {string} name the result row's name, e.g. `pd-6p2d/cache_aware`
 * @property {string} config the cluster shape, e.g. `pd-6p2d`
 * @property {string} protocol the cluster document's protocol
 * @property {Record<string, number>} nodes nodes by role (`prefill`, `decode`, `both`)
 * @property {Record<string, unknown>} policy the cluster document's policy, passed as-is
 * @property {boolean} [enabled] false: listed, not run
 * @property {string} [why] why it is not run
 */

/** @param {string} [file] @returns {AgenticConfig[]} */
export function agenticConfigs(file) {
  const doc = JSON.parse(readFileSync(file ?? path.join(HERE, 'agentic-configs.json'), 'utf8'));
  return doc.configs;
}

/** @param {Record<string, string | true>} options */
export function agenticConfig(options) {
  const quick = options.quick === true;
  const only = stringOption(options, 'config');
  return {
    requests: numberOption(options, 'requests', quick ? 200 : 1000),
    seed: numberOption(options, 'seed', AGENTIC_SEED),
    // sessions a simulated second; calibrated (docs/simulator.md)
    sessionsPerS: numberOption(options, 'sessions-per-s', 1),
    timeScale: numberOption(options, 'time-scale', quick ? 0.01 : 0.05),
    preset: stringOption(options, 'preset', 'seed002'),
    configsFile: stringOption(options, 'configs'),
    only: only ? only.split(',').map((s) => s.trim()) : undefined,
    engine: engineOverrides(options),
    quick,
  };
}

/** @param {Record<string, number>} nodes */
function enginesOf(nodes) {
  const out = [];
  for (const [role, n] of Object.entries(nodes)) {
    const prefix = role === 'prefill' ? 'p' : role === 'decode' ? 'd' : 'n';
    for (let i = 0; i < n; i++) out.push({ id: `${prefix}${i}`, role: /** @type {'prefill' | 'decode' | 'both'} */ (role) });
  }
  return out;
}

/** @param {Record<string, string | true>} options */
export async function runAgentic(options) {
  const cfg = agenticConfig(options);
  const trace = agenticTrace({ requests: cfg.requests, seed: cfg.seed, sessionsPerS: cfg.sessionsPerS });
  const profile = agenticProfile(trace);
  const all = agenticConfigs(cfg.configsFile);
  const chosen = all.filter((c) => (cfg.only ? cfg.only.includes(c.name) : c.enabled !== false));
  const skipped = all.filter((c) => !chosen.includes(c)).map((c) => ({ name: c.name, why: c.why ?? 'not selected' }));
  const results = [];
  for (const c of chosen) {
    const stack = await startStack({
      engines: enginesOf(c.nodes),
      defaults: { timeScale: cfg.timeScale, preset: cfg.preset, ...cfg.engine },
      clusterDocument: (started) => ({
        protocol: c.protocol,
        policy: c.policy,
        // requests of a minute or more are normal here: the router's defaults are 2 minutes a leg
        timeouts: { prefillMs: 600000, decodeFirstByteMs: 600000, decodeIdleMs: 600000, nonStreamMs: 21600000 },
        // a simulated P's Mooncake bootstrap server answers on its HTTP port
        nodes: [...started.values()].map((e) => ({ id: e.id, url: e.url, role: e.role, bootstrapPort: e.bootstrapPort })),
      }),
    });
    try {
      const started = performance.now();
      const outcomes = await replay(stack, trace, cfg.timeScale, c.name);
      const wallS = (performance.now() - started) / 1000;
      const stats = await stack.stats();
      const perRequest = await stack.requestStats();
      results.push({ ...agenticFigures(c, outcomes, stats, perRequest, cfg.timeScale), wallS: round(wallS, 1) });
      process.stderr.write(`agentic ${c.name}: ${round(wallS, 1)} s\n`);
    } finally {
      await stack.close();
    }
  }
  const comparisons = agenticComparisons(results);
  return {
    report: { scenario: 'agentic', config: { ...cfg, configs: chosen.map((c) => c.name) }, profile, skipped, results, comparisons, published: SEED002 },
    table: `${profileTable(profile)}\n\n${agenticTable(results)}\n\n${comparisonsTable(comparisons)}${skipped.length ? `\n\nnot run: ${skipped.map((s) => `${s.name} (${s.why})`).join('; ')}` : ''}`,
    chart: {
      title: `agentic (seed 002): ${cfg.requests} requests, 8 x H20 + Qwen3-Coder-30B-A3B (simulated)`,
      series: results.map((r) => r.name),
      figures: [
        { name: 'TTFT p50 (sim s)', values: results.map((r) => r.ttftP50Ms / 1000) },
        { name: 'TTFT p90 (sim s)', values: results.map((r) => r.ttftP90Ms / 1000) },
        { name: 'prefix hit ratio', values: results.map((r) => r.hitRatio) },
        { name: 'decode KV peak', values: results.map((r) => r.decodeKvPeak) },
        { name: 'TTFT share waiting for KV', values: results.map((r) => r.kvWaitShare) },
      ],
    },
  };
}

/**
 * Send the trace: each session at its arrival (simulated time), its turns one after the other.
 * @param {import('../lib/harness.mjs').Stack} stack
 * @param {import('../lib/agentic-trace.mjs').AgenticRequest[]} trace
 * @param {number} timeScale @param {string} tag
 */
async function replay(stack, trace, timeScale, tag) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 512 });
  const t0 = stack.simNowMs();
  /** wait until the cluster's clock reaches t0 + ms (simulated) */
  const until = async (/** @type {number} */ ms) => {
    for (;;) {
      const left = t0 + ms - stack.simNowMs();
      if (left <= 0) return;
      await sleep(Math.max(1, left * timeScale));
    }
  };
  /** @type {Map<number, typeof trace>} */
  const sessions = new Map();
  for (const r of trace) {
    if (!sessions.has(r.session)) sessions.set(r.session, []);
    /** @type {typeof trace} */ (sessions.get(r.session)).push(r);
  }
  /** @type {{ id: string, session: number, turn: number, status: number, error?: string, totalMs: number }[]} */
  const outcomes = [];
  const runSession = async (/** @type {typeof trace} */ turns) => {
    await until(turns[0].arrivalS * 1000);
    for (const r of turns) {
      if (r.thinkS > 0) await sleep(r.thinkS * 1000 * timeScale);
      const id = `agentic-s${r.session}-t${r.turn}`;
      const res = await postJson(
        `${stack.router.url}/v1/completions`,
        { model: 'sim-model', prompt: promptOfTraceRequest(r), max_tokens: r.output_length, stream: false },
        { agent, headers: { 'x-request-id': id, 'x-session-id': `${tag}-s${r.session}` } },
      );
      const error = res.error ?? (res.status === 200 ? undefined : `HTTP ${res.status}: ${JSON.stringify(res.json ?? '').slice(0, 200)}`);
      outcomes.push({ id, session: r.session, turn: r.turn, status: res.status, error, totalMs: res.totalMs });
      if (error) break; // the session's history is broken from here
    }
  };
  await Promise.all([...sessions.values()].map(runSession));
  agent.destroy();
  return outcomes;
}

/**
 * @param {AgenticConfig} c
 * @param {{ id: string, status: number, error?: string, totalMs: number }[]} outcomes
 * @param {Record<string, any>} stats @param {Record<string, Record<string, any>>} perRequest
 * @param {number} timeScale
 */
export function agenticFigures(c, outcomes, stats, perRequest, timeScale) {
  const engines = Object.values(stats);
  const prefillSide = engines.filter((e) => e.role === 'prefill' || e.role === 'both');
  const decodeSide = engines.filter((e) => e.role === 'decode' || e.role === 'both');
  const sum = (/** @type {any[]} */ list, /** @type {(e: any) => number} */ f) => list.reduce((a, e) => a + f(e), 0);
  // the record of the leg that produced the answer (the D leg, or the colocated node), per request
  /** @type {Map<string, any>} */
  const answered = new Map();
  for (const [upstreamId, legs] of Object.entries(perRequest)) {
    const m = /(agentic-s\d+-t\d+)/.exec(upstreamId);
    if (!m) continue;
    for (const rec of Object.values(legs)) if (rec.ttftMs !== undefined) answered.set(m[1], rec);
  }
  const ok = outcomes.filter((o) => o.status === 200 && !o.error);
  const recs = ok.map((o) => answered.get(o.id)).filter(Boolean);
  const ttft = recs.map((r) => r.ttftMs);
  const tpot = recs.map((r) => r.tpotMs).filter(Number.isFinite);
  const e2e = recs.map((r) => r.e2eMs);
  const overhead = ok.map((o) => {
    const r = answered.get(o.id);
    return r ? Math.max(0, o.totalMs / timeScale - r.e2eMs) : NaN;
  });
  return {
    name: c.name,
    config: c.config,
    policy: String(c.policy.prefill ?? ''),
    disaggregation: /** @type {string} */ (c.policy.disaggregation ?? (c.protocol === 'colocated' ? 'none' : 'always')),
    protocol: c.protocol,
    ttftP50Ms: round(percentile(ttft, 50), 1),
    ttftP90Ms: round(percentile(ttft, 90), 1),
    tpotP90Ms: round(percentile(tpot, 90), 2),
    e2eP50Ms: round(percentile(e2e, 50), 1),
    // the prefix hit ratio as the engines count it: tokens found in the prefill side's caches
    hitRatio: round(
      sum(prefillSide, (e) => e.cachedTokens) /
        Math.max(
          1,
          sum(prefillSide, (e) => e.promptTokens),
        ),
      4,
    ),
    decodeKvPeak: round(Math.max(...decodeSide.map((e) => e.kvUsagePeak)), 4),
    decodeKvMean: round(mean(decodeSide.map((e) => e.kvUsageMean)), 4),
    kvWaitShare: round(
      sum(recs, (r) => r.kvWaitMs ?? 0) /
        Math.max(
          1,
          sum(recs, (r) => r.ttftMs),
        ),
      4,
    ),
    completed: ok.length,
    failed: outcomes.length - ok.length,
    errorSamples: [...new Set(outcomes.filter((o) => o.error).map((o) => String(o.error)))].slice(0, 5),
    preemptions: sum(decodeSide, (e) => e.preemptions),
    decodeRequests: decodeSide.map((e) => e.requests.total),
    routerOverheadSimP50Ms: round(percentile(overhead.filter(Number.isFinite), 50), 1),
  };
}

/** Ours against the published ratios (seed 002). @param {Record<string, any>[]} results */
export function agenticComparisons(results) {
  const by = Object.fromEntries(results.map((r) => [r.name, r]));
  const pub = /** @type {Record<string, Record<string, number>>} */ (SEED002.configs);
  /** @type {ReturnType<typeof compareRatio>[]} */
  const out = [];
  const pair = (/** @type {string} */ a, /** @type {string} */ b, /** @type {string} */ k, /** @type {string} */ what) => {
    if (by[a] && by[b] && pub[a]?.[k] !== undefined && pub[b]?.[k] !== undefined) out.push(compareRatio(what, pub[a][k], pub[b][k], by[a][k], by[b][k]));
  };
  pair('colocated-8/round_robin', 'colocated-8/cache_aware', 'ttftP50Ms', 'TTFT p50: colocated round-robin / cache-aware');
  pair('pd-4p4d/cache_aware', 'colocated-8/cache_aware', 'ttftP50Ms', 'TTFT p50: PD 4P+4D / colocated cache-aware');
  pair('pd-6p2d/cache_aware', 'colocated-8/cache_aware', 'ttftP50Ms', 'TTFT p50: PD 6P+2D / colocated cache-aware');
  pair('pd-6p2d/cache_aware', 'pd-4p4d/cache_aware', 'ttftP50Ms', 'TTFT p50: PD 6P+2D / PD 4P+4D');
  pair('colocated-8/round_robin', 'colocated-8/cache_aware', 'tpotP90Ms', 'TPOT p90: colocated round-robin / cache-aware');
  pair('colocated-8/cache_aware', 'colocated-8/round_robin', 'hitRatio', 'APC: colocated cache-aware / round-robin');
  pair('colocated-8/cache_aware', 'pd-4p4d/cache_aware', 'hitRatio', 'APC: colocated cache-aware / PD 4P+4D');
  return out;
}

/** @param {ReturnType<typeof agenticProfile>} p */
function profileTable(p) {
  return markdownTable(
    ['trace', 'requests', 'sessions', 'single-turn sessions', 'input mean / p50 / p90', 'output mean / p50', 'infinite-cache ceiling'],
    [
      ['published (seed 002)', '', '', '90%', '33.6k / 20k / 88k', '445 / 80', 0.71],
      [
        'ours',
        p.requests,
        p.sessions,
        `${Math.round(p.singleTurnSessionShare * 100)}%`,
        `${round(p.inputMean / 1000, 1)}k / ${round(p.inputP50 / 1000, 1)}k / ${round(p.inputP90 / 1000, 1)}k`,
        `${Math.round(p.outputMean)} / ${p.outputP50}`,
        round(p.ceiling, 3),
      ],
    ],
  );
}

/** @param {Record<string, any>[]} results */
function agenticTable(results) {
  return markdownTable(
    [
      'config',
      'TTFT p50 / p90 s',
      'TPOT p90 ms',
      'E2E p50 s',
      'APC',
      'decode KV peak / mean',
      'TTFT share waiting for KV',
      'completed (failed)',
      'preemptions',
      'router p50 (sim ms)',
      'wall s',
    ],
    results.map((r) => [
      r.name,
      `${round(r.ttftP50Ms / 1000, 3)} / ${round(r.ttftP90Ms / 1000, 3)}`,
      r.tpotP90Ms,
      round(r.e2eP50Ms / 1000, 2),
      r.hitRatio,
      `${r.decodeKvPeak} / ${r.decodeKvMean}`,
      r.kvWaitShare,
      `${r.completed} (${r.failed})`,
      r.preemptions,
      r.routerOverheadSimP50Ms,
      r.wallS,
    ]),
  );
}
