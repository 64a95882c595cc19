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
// Time: --time-scale real ms per simulated ms; the router's real time per request shows in the
// report. The router polls the engines' /metrics in real time (signals.intervalMs, at least 1 s)
// and its admission queue waits in real time: at a small time scale one poll is a long stretch of
// simulated time. --parallel N runs N configurations at once, each in its own process (its own
// engines, clock, event loop and router; a run keeps the machine mostly idle), so a larger time
// scale fits the same wall time. A request's time waiting at the edge (server-timing `queue`) is the client's: it is added
// to the engines' TTFT and E2E, in simulated ms.
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import http from 'node:http';
import { engineOverrides, numberOption, stringOption } from '../lib/args.mjs';
import { AGENTIC_SEED, PUBLISHED_HIT_BUCKETS, agenticProfile, agenticTrace, hitBuckets } from '../lib/agentic-trace.mjs';
import { decodeKvCeiling } from '../lib/decode-kv-ceiling.mjs';
import { onShutdown, startStack, workerSnapshot } from '../lib/harness.mjs';
import { postJsonRetrying } from '../lib/http-client.mjs';
import { markdownTable } from '../lib/report.mjs';
import { SEED002, comparePairs, comparisonsTable } from '../lib/seeds.mjs';
import { routerMetrics, sumBy, total } from '../lib/prometheus.mjs';
import { presetProfile, watchRelearn } from '../lib/relearn.mjs';
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
 * @property {boolean} [engineSignals] false: the router reads no engine signals (hideEngineSignals), as
 *   the study's own scheduler, which scored ongoing tokens and cache hits and read no engine's KV
 */

/** @param {string} [file] @returns {AgenticConfig[]} */
export function agenticConfigs(file) {
  return agenticConfigsFile(file).configs;
}

/**
 * The configurations file: the rows, and `document`, the cluster document's settings every row
 * shares (signals, admission).
 * @param {string} [file] @returns {{ configs: AgenticConfig[], document?: Record<string, unknown> }}
 */
export function agenticConfigsFile(file) {
  return JSON.parse(readFileSync(file ?? path.join(HERE, 'agentic-configs.json'), 'utf8'));
}

/** @param {Record<string, string | true>} options */
export function agenticConfig(options) {
  const quick = options.quick === true;
  const only = stringOption(options, 'config');
  return {
    requests: numberOption(options, 'requests', quick ? 200 : 1000),
    seed: numberOption(options, 'seed', AGENTIC_SEED),
    // sessions a simulated second arrive (a Poisson process); with the cap below the replay is a
    // closed loop and this only has to be fast enough for the cap to bind
    sessionsPerS: numberOption(options, 'sessions-per-s', 1),
    // the study's --max-inflight-sessions 8: a session starts when one of 8 slots is free (0: no cap)
    maxInflightSessions: numberOption(options, 'max-inflight-sessions', 8),
    // the headline (no flags): every configuration at once, each 4-7 minutes at 0.04 (the
    // engines' ~5,000 simulated seconds plus the router's real time between a session's turns;
    // docs/simulator.md)
    timeScale: numberOption(options, 'time-scale', quick ? 0.01 : 0.04),
    // configurations run at once (each its own engines, clock and router); default: all of them
    parallel: Math.max(1, numberOption(options, 'parallel', quick ? 1 : 8)),
    preset: stringOption(options, 'preset', 'seed002'),
    configsFile: stringOption(options, 'configs'),
    only: only ? only.split(',').map((s) => s.trim()) : undefined,
    engine: engineOverrides(options),
    // --stream: the clients stream their answers (as a client measuring TTFT does). The router
    // learns transfers and holds a predicted TTFT against D's first event only in a stream: a
    // non-streamed answer's first byte is its last (docs/predicted.md)
    stream: options.stream === true,
    // --slow-node p0 [--slow-factor 2] [--slow-at-s 60]: that engine's prefill made slower this many
    // real seconds into each row's run, and how soon the router's learned rate shows it (bench/lib/relearn.mjs)
    slowNode: stringOption(options, 'slow-node'),
    slowFactor: numberOption(options, 'slow-factor', 2),
    slowAtS: numberOption(options, 'slow-at-s', 60),
    // --profile: the document's `profile` (the learned rates' prior, SPEC 9) from the preset's public
    // figures at the run's time scale, as an operator sets it from the hardware (presetProfile)
    profile: options.profile === true,
    // --router-time real: the router's real time between the engines passes as simulated time (as
    // before issue 22's item 5); default held: the clock stands while the router has a request in
    // hand, so a busy machine does not thin the closed loop (sim/model/router-holds.mjs)
    routerTime: stringOption(options, 'router-time', 'held') === 'real' ? 'real' : 'held',
    // --trace-profile '{"coldSigma":1.6}': the generator's parameters over AGENTIC_PROFILE (to try a workload's shape)
    traceProfile: /** @type {Record<string, number>} */ (JSON.parse(stringOption(options, 'trace-profile', '{}'))),
    quick,
  };
}

/**
 * The study's scheduler (score = ongoing tokens / mean load - alpha x cache hit) read nothing from
 * the engines, so nothing stopped it sending a decode leg to a D whose KV was full: the request
 * waited inside the engine for memory (the study's decode log: `Running: 0 reqs, Waiting: 6 reqs,
 * KV cache: 97.1%`). The router's decode KV guard and KV barrier read the engines' `/metrics`
 * (SPEC 8), and with no fresh reading they fail open (routing/kv-guard.ts): every engine of a row
 * with `engineSignals: false` answers its `/metrics` 404, so the router decides as that scheduler.
 * @param {{ cluster: { engines: Map<string, any> } }} stack
 */
export function hideEngineSignals(stack) {
  for (const e of stack.cluster.engines.values()) e.setMetricsFault({ mode: 'status', status: 404 });
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
  const trace = agenticTrace({ requests: cfg.requests, seed: cfg.seed, sessionsPerS: cfg.sessionsPerS, profile: cfg.traceProfile });
  const profile = agenticProfile(trace);
  const file = agenticConfigsFile(cfg.configsFile);
  const all = file.configs;
  const chosen = all.filter((c) => (cfg.only ? cfg.only.includes(c.name) : c.enabled !== false));
  const skipped = all.filter((c) => !chosen.includes(c)).map((c) => ({ name: c.name, why: c.why ?? 'not selected' }));
  const runOne = async (/** @type {AgenticConfig} */ c) => {
    const stack = await startStack({
      engines: enginesOf(c.nodes),
      // every ITL sample kept: a decode node of 6P+2D emits ~250k tokens in a 1,000-request run
      defaults: { timeScale: cfg.timeScale, preset: cfg.preset, sampleCap: 2_000_000, ...cfg.engine },
      clusterDocument: (started) => ({
        ...file.document,
        protocol: c.protocol,
        policy: c.policy,
        ...(cfg.profile ? { profile: presetProfile(cfg.preset, cfg.timeScale) } : {}),
        // requests of a minute or more are normal here: the router's defaults are 2 minutes a leg
        timeouts: { prefillMs: 600000, decodeFirstByteMs: 600000, decodeIdleMs: 600000, nonStreamMs: 21600000 },
        // a simulated P's Mooncake bootstrap server answers on its HTTP port
        nodes: [...started.values()].map((e) => ({ id: e.id, url: e.url, role: e.role, bootstrapPort: e.bootstrapPort })),
      }),
    });
    if (c.engineSignals === false) hideEngineSignals(stack);
    try {
      const started = performance.now();
      const watch = cfg.slowNode
        ? watchRelearn({ routerUrl: stack.router.url, controlUrl: stack.cluster.controlUrl, node: cfg.slowNode, preset: cfg.preset, factor: cfg.slowFactor, slowAtS: cfg.slowAtS })
        : null;
      const outcomes = await replay(stack, trace, cfg.timeScale, c.name, cfg.maxInflightSessions, cfg.stream, cfg.routerTime === 'held');
      const wallS = (performance.now() - started) / 1000;
      const relearn = watch ? await watch.stop() : undefined;
      if (relearn)
        process.stderr.write(
          `agentic ${c.name}: ${cfg.slowNode} slowed ${cfg.slowFactor}x at ${relearn.slowedAtS} s; learned rate ${relearn.rateBefore} tokens/s before, half way ${relearn.halfWayS} s after, within 25% of the new rate ${relearn.learnedS} s after\n`,
        );
      const stats = await stack.stats();
      const perRequest = await stack.requestStats();
      const metrics = await routerMetrics(stack.router.url);
      process.stderr.write(`agentic ${c.name}: ${round(wallS, 1)} s\n`);
      const figures = agenticFigures(c, outcomes, stats, perRequest, cfg.timeScale, metrics, trace.length);
      const time = stack.time();
      return {
        ...figures,
        decodeKvCeiling: ceilingOf(trace, stats, cfg.maxInflightSessions, figures.tpotP90Ms),
        wallS: round(wallS, 1),
        routerTime: { mode: cfg.routerTime, heldS: round(time.clock.heldRealMs / 1000, 1), holds: time.holds.holds, capped: time.holds.capped },
        ...(relearn ? { relearn } : {}),
      };
    } finally {
      await stack.close();
    }
  };
  /** @type {Record<string, any>[]} */
  const results = new Array(chosen.length);
  let next = 0;
  const runIt = cfg.parallel > 1 && chosen.length > 1 ? (/** @type {AgenticConfig} */ c) => runInChild(c, options) : runOne;
  if (cfg.parallel > 1) workerSnapshot(); // the report names the Worker code the children measured
  await Promise.all(
    Array.from({ length: Math.min(cfg.parallel, chosen.length) }, async () => {
      while (next < chosen.length) {
        const i = next++;
        results[i] = await runIt(chosen[i]);
      }
    }),
  );
  const comparisons = agenticComparisons(results);
  const report = {
    scenario: 'agentic',
    config: { ...cfg, configs: chosen.map((c) => c.name), document: file.document ?? {} },
    profile,
    skipped,
    results,
    comparisons,
    published: SEED002,
  };
  return {
    report,
    table: agenticMarkdown(report),
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
 * One configuration in a child process (`bench/run.mjs agentic --config NAME`, the same options),
 * so the simulated engines of concurrent configurations do not share an event loop: a late event
 * would stretch the simulated time of all of them.
 * @param {AgenticConfig} c @param {Record<string, string | true>} options
 * @returns {Promise<Record<string, any>>}
 */
async function runInChild(c, options) {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'pd-bench-agentic-'));
  const json = path.join(dir, 'result.json');
  const argv = [];
  for (const [k, v] of Object.entries({ ...options, config: c.name, parallel: '1', json })) argv.push(v === true ? `--${k}` : `--${k}=${v}`);
  const child = spawn(process.execPath, [path.join(HERE, '..', 'run.mjs'), 'agentic', ...argv], { stdio: ['ignore', 'ignore', 'pipe'], env: process.env });
  const stop = onShutdown(async () => void child.kill('SIGTERM'));
  /** @type {string[]} */
  const tail = [];
  child.stderr.on('data', (/** @type {Buffer} */ d) => {
    process.stderr.write(d);
    tail.push(d.toString('utf8'));
    if (tail.length > 20) tail.shift();
  });
  try {
    const code = await new Promise((resolve) => child.once('exit', resolve));
    if (code !== 0) throw new Error(`agentic ${c.name}: the child run exited with ${code}: ${tail.join('').slice(-2000)}`);
    return JSON.parse(readFileSync(json, 'utf8')).results[0];
  } finally {
    stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

/**
 * @typedef {{ id: string, session?: number, turn?: number, status: number, error?: string, totalMs: number, mode?: string, edgeQueueMs?: number, retries?: number, routerHeldMs?: number }} AgenticOutcome
 *   mode: the route receipt (x-pd-mode); edgeQueueMs: real ms the request waited at the edge for a
 *   decode node that was not busy (server-timing `queue`), 0 when it did not wait
 */

/** The `queue` entry of a server-timing header, in ms (0 when absent). @param {unknown} header */
export function edgeQueueMs(header) {
  const m = /(?:^|,\s*)queue;dur=([0-9.]+)/.exec(typeof header === 'string' ? header : '');
  return m ? Number(m[1]) : 0;
}

/**
 * Send the trace: each session at its arrival (simulated time), its turns one after the other;
 * with `maxInflightSessions` > 0 at most that many sessions at once, the next one starting when a
 * session ends (the study's closed loop, `--max-inflight-sessions 8`).
 * @param {import('../lib/harness.mjs').Stack} stack
 * @param {import('../lib/agentic-trace.mjs').AgenticRequest[]} trace
 * @param {number} timeScale @param {string} tag @param {number} [maxInflightSessions] 0: no cap
 * @param {boolean} [stream] the clients stream their answers (--stream)
 * @param {boolean} [holdRouterTime] stop the clock while the router has a request in hand (--router-time)
 */
async function replay(stack, trace, timeScale, tag, maxInflightSessions = 0, stream = false, holdRouterTime = false) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 512 });
  const holds = holdRouterTime ? stack.time().holds : undefined;
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
  /** @type {AgenticOutcome[]} */
  const outcomes = [];
  const runSession = async (/** @type {typeof trace} */ turns) => {
    await until(turns[0].arrivalS * 1000);
    for (const r of turns) {
      // the tool's run between two turns, in simulated time
      if (r.thinkS > 0) await until(stack.simNowMs() - t0 + r.thinkS * 1000);
      const id = `agentic-s${r.session}-t${r.turn}`;
      holds?.sent(id);
      // a keep-alive socket the server closed while idle (a session's tool run) is retried: the
      // request never reached the router (http-client.mjs isDevProxyGlitch); counted
      const res = await postJsonRetrying(
        `${stack.router.url}/v1/completions`,
        { model: 'sim-model', prompt: promptOfTraceRequest(r), max_tokens: r.output_length, stream },
        { agent, headers: { 'x-request-id': id, 'x-session-id': `${tag}-s${r.session}` } },
      );
      const routerHeldMs = holds?.answered(id);
      const error = res.error ?? (res.status === 200 ? undefined : `HTTP ${res.status}: ${JSON.stringify(res.json ?? '').slice(0, 200)}`);
      outcomes.push({
        id,
        session: r.session,
        turn: r.turn,
        status: res.status,
        error,
        totalMs: res.totalMs,
        mode: typeof res.headers['x-pd-mode'] === 'string' ? res.headers['x-pd-mode'] : undefined,
        edgeQueueMs: edgeQueueMs(res.headers['server-timing']),
        retries: res.retries ?? 0,
        routerHeldMs,
      });
      if (error) break; // the session's history is broken from here
    }
  };
  await inSlots([...sessions.values()], maxInflightSessions, runSession);
  agent.destroy();
  return outcomes;
}

/**
 * Run `task` on every item in order, at most `slots` at once (0: all at once); a slot is taken
 * when an item starts and freed when it ends.
 * @template T @param {T[]} items @param {number} slots @param {(item: T) => Promise<void>} task
 */
export async function inSlots(items, slots, task) {
  if (!(slots > 0)) {
    await Promise.all(items.map(task));
    return;
  }
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(slots, items.length) }, async () => {
      while (next < items.length) await task(items[next++]);
    }),
  );
}

/** Legs whose engine computed the prompt: P's, or the node's own (colocated, a decode node prefilling alone). */
const PREFILL_LEGS = new Set(['vllmPrefill', 'mooncakePrefill', 'sglangPrefill', 'colocated']);

/**
 * The decode KV this run's closed loop could hold at most (bench/lib/decode-kv-ceiling.mjs): every
 * request holding its prompt and output for its whole decode at the run's TPOT p90, over the
 * shortest span the sessions allow. The mean is over the decode nodes'
 * blocks (as decodeKvMean, their mean); the peak as on one node (as decodeKvPeak, their highest):
 * every request in flight on it, at most all its blocks.
 * @param {import('../lib/agentic-trace.mjs').AgenticRequest[]} trace @param {Record<string, any>} stats
 * @param {number} inflight @param {number} tpotMs
 */
function ceilingOf(trace, stats, inflight, tpotMs) {
  const capacities = Object.values(stats)
    .filter((e) => e.role === 'decode' || e.role === 'both')
    .map((e) => e.numGpuBlocks * e.blockSize);
  const capacityTokens = capacities.reduce((a, n) => a + n, 0);
  if (!(capacityTokens > 0 && Number.isFinite(tpotMs))) return undefined;
  const c = decodeKvCeiling(trace, { inflight, tpotMs, capacityTokens });
  const onOneNode = (c.peak * capacityTokens) / Math.min(...capacities);
  return { mean: round(c.mean, 4), peak: round(Math.min(1, onOneNode), 4) };
}

/**
 * @param {AgenticConfig} c
 * @param {AgenticOutcome[]} outcomes
 * @param {Record<string, any>} stats @param {Record<string, Record<string, any>>} perRequest
 * @param {number} timeScale
 * @param {import('../lib/prometheus.mjs').Sample[]} [metrics] the router's /metrics after the run
 * @param {number} [requestsInTrace]
 */
export function agenticFigures(c, outcomes, stats, perRequest, timeScale, metrics = [], requestsInTrace = outcomes.length) {
  const engines = Object.values(stats);
  const decodeSide = engines.filter((e) => e.role === 'decode' || e.role === 'both');
  const sum = (/** @type {any[]} */ list, /** @type {(e: any) => number} */ f) => list.reduce((a, e) => a + f(e), 0);
  // per request: the record of the leg that produced the answer (the D leg, or the node that
  // served alone) and of the leg that computed the prompt (P's, or that same node's)
  /** @type {Map<string, any>} */
  const answered = new Map();
  /** @type {Map<string, any>} */
  const prefilled = new Map();
  for (const [upstreamId, legs] of Object.entries(perRequest)) {
    const m = /(agentic-s\d+-t\d+)/.exec(upstreamId);
    if (!m) continue;
    for (const rec of Object.values(legs)) {
      if (rec.ttftMs !== undefined) answered.set(m[1], rec);
      if (PREFILL_LEGS.has(rec.leg) && rec.promptTokens !== undefined) prefilled.set(m[1], rec);
    }
  }
  const ok = outcomes.filter((o) => o.status === 200 && !o.error && answered.has(o.id));
  // the client's time: what it waited at the edge (real ms, scaled) and then the engines' own
  const edge = (/** @type {AgenticOutcome} */ o) => (o.edgeQueueMs ?? 0) / timeScale;
  const ttftOf = (/** @type {AgenticOutcome} */ o) => edge(o) + answered.get(o.id).ttftMs;
  const ttft = ok.map(ttftOf);
  const tpot = ok.map((o) => answered.get(o.id).tpotMs).filter(Number.isFinite);
  // every gap between two tokens the decoding engines emitted (a step that also landed KV or ran a prefill chunk shows here)
  const itl = decodeSide.flatMap((e) => e.itlMs ?? []);
  const e2e = ok.map((o) => edge(o) + answered.get(o.id).e2eMs);
  const generation = ok.map((o) => answered.get(o.id).e2eMs - answered.get(o.id).ttftMs);
  // the router's own time a request, in simulated ms as it would have passed: with the clock held
  // (--router-time held) the real ms it had the request in hand, else what the client waited
  // beyond the engines and the edge queue
  const overhead = ok.map((o) => (o.routerHeldMs !== undefined ? o.routerHeldMs / timeScale : Math.max(0, o.totalMs / timeScale - edge(o) - answered.get(o.id).e2eMs)));
  const queued = ok.filter((o) => (o.edgeQueueMs ?? 0) > 0);
  const prefillRecs = ok.map((o) => prefilled.get(o.id)).filter(Boolean);
  /** @type {Record<string, number>} */
  const modes = {};
  for (const o of ok) modes[o.mode ?? 'none'] = (modes[o.mode ?? 'none'] ?? 0) + 1;
  const decisions = Object.fromEntries(Object.entries(sumBy(metrics, 'pd_router_disagg_decisions_total', ['mode', 'reason'])).filter(([, n]) => n > 0));
  return {
    name: c.name,
    config: c.config,
    policy: String(c.policy.prefill ?? ''),
    disaggregation: /** @type {string} */ (c.policy.disaggregation ?? (c.protocol === 'colocated' ? 'none' : 'always')),
    protocol: c.protocol,
    // how the decode leg is sent: after P answered (await: the router's vllm protocol, NIXL-style),
    // or with P at once, D taking its blocks on arrival (fire-and-forget: vllm-mooncake, sglang)
    dispatch: c.protocol === 'colocated' ? 'colocated' : c.protocol === 'vllm' ? 'await' : 'fire-and-forget',
    // false: the router read no engine signals (the study's scheduler: hideEngineSignals)
    engineSignals: c.engineSignals !== false,
    ttftP50Ms: round(percentile(ttft, 50), 1),
    ttftP90Ms: round(percentile(ttft, 90), 1),
    // every completed request's TTFT, sorted: `runs-spread` pools them over several runs, where one
    // run's p90 of 300 requests moves in steps (which long cold prompt is the 270th decides it)
    ttftsMs: ttft.map((x) => round(x, 1)).sort((x, y) => x - y),
    tpotP50Ms: round(percentile(tpot, 50), 2),
    tpotP90Ms: round(percentile(tpot, 90), 2),
    itlP50Ms: round(percentile(itl, 50), 2),
    itlP99Ms: round(percentile(itl, 99), 2),
    e2eP50Ms: round(percentile(e2e, 50), 1),
    // what the end to end holds besides the TTFT: the engine's generation time (first token to
    // last) and the tokens it generated, medians over the requests (the study publishes E2E p50
    // and TTFT p50 but not these; docs/benchmark-seeds.md reads its E2E with them)
    decodeP50Ms: round(percentile(generation, 50), 1),
    outputTokensP50: percentile(ok.map((o) => answered.get(o.id).outputTokens).filter(Number.isFinite), 50),
    // the prefix hit ratio as the engines count it: tokens found in the cache of the engine that
    // computed each prompt (P, the colocated node, or a decode node prefilling alone)
    hitRatio: round(
      sum(prefillRecs, (r) => r.cachedTokens ?? 0) /
        Math.max(
          1,
          sum(prefillRecs, (r) => r.promptTokens),
        ),
      4,
    ),
    // requests by prefix hit on the engine that computed them (the study's buckets)
    hitBuckets: hitBuckets(prefillRecs.map((r) => ({ input_length: r.promptTokens, hit: r.cachedTokens ?? 0 }))),
    decodeKvPeak: round(Math.max(...decodeSide.map((e) => e.kvUsagePeak)), 4),
    decodeKvMean: round(mean(decodeSide.map((e) => e.kvUsageMean)), 4),
    kvWaitShare: round(
      sum(ok, (o) => answered.get(o.id).kvWaitMs ?? 0) /
        Math.max(
          1,
          sum(ttft, (t) => t),
        ),
      4,
    ),
    // requests that waited at the edge for a decode node that was not busy (admission queue)
    edgeQueued: queued.length,
    edgeQueueP90Ms: round(percentile(queued.map(edge), 90), 1),
    edgeQueueMaxMs: round(Math.max(0, ...queued.map(edge)), 1),
    edgeWaitShare: round(
      sum(ok, edge) /
        Math.max(
          1,
          sum(ttft, (t) => t),
        ),
      4,
    ),
    ttftBreakdown: ttftBreakdown(ok, answered, prefilled, edge),
    // the decode leg's own part, means in simulated ms: its queue (for KV memory too), the pull
    decodeLeg: decodeLegMeans(ok.map((o) => answered.get(o.id)).filter((a) => a.leg !== 'colocated')),
    modes,
    decisions,
    admissionRejected: total(metrics, 'pd_router_admission_rejected_total'),
    completed: ok.length,
    failed: outcomes.length - ok.length,
    // sessions stop at a failed turn: requests of the trace never sent
    notSent: Math.max(0, requestsInTrace - outcomes.length),
    clientRetries: outcomes.reduce((a, o) => a + (o.retries ?? 0), 0),
    errorSamples: [...new Set(outcomes.filter((o) => o.error).map((o) => String(o.error)))].slice(0, 5),
    preemptions: sum(decodeSide, (e) => e.preemptions),
    decodeRequests: decodeSide.map((e) => e.requests.total),
    routerOverheadSimP50Ms: round(percentile(overhead, 50), 1),
    predictionRatio: predictionRatio(metrics),
    // each node's prefill rate as the router learned it by the end (its /metrics): how far nodes
    // of one kind drift apart on what they measured
    learnedPrefillTokensPerS: Object.fromEntries(Object.entries(sumBy(metrics, 'pd_router_node_prefill_tokens_per_second', ['node'])).map(([node, v]) => [node, Math.round(v)])),
  };
}

/**
 * How good the predicted TTFT was (`pd_router_ttft_prediction_ratio`, actual / predicted): the
 * requests it was judged on, the share within 25 % (issue 23's goal: median |actual / predicted - 1|
 * <= 0.25, that is a share of 0.5 or more) and the median ratio, read off the buckets (linear within
 * one). Null when no request was predicted (every policy but `predicted`).
 * @param {import('../lib/prometheus.mjs').Sample[]} metrics
 */
export function predictionRatio(metrics) {
  const buckets = metrics
    .filter((s) => s.name === 'pd_router_ttft_prediction_ratio_bucket')
    .map((s) => ({ le: s.labels.le === '+Inf' ? Infinity : Number(s.labels.le), n: s.value }))
    .sort((a, b) => a.le - b.le);
  const count = buckets.at(-1)?.n ?? 0;
  if (count === 0) return null;
  const at = (/** @type {number} */ le) => buckets.find((b) => b.le === le)?.n ?? Number.NaN;
  let median = Number.NaN;
  for (const [i, b] of buckets.entries()) {
    if (b.n < count / 2) continue;
    const lo = i > 0 ? buckets[i - 1] : { le: 0, n: 0 };
    median = Number.isFinite(b.le) ? lo.le + ((b.le - lo.le) * (count / 2 - lo.n)) / Math.max(1, b.n - lo.n) : lo.le;
    break;
  }
  return { count, within25: round((at(1.25) - at(0.75)) / count, 3), median: round(median, 3) };
}

/** @param {any[]} recs decode legs' records */
function decodeLegMeans(recs) {
  const m = (/** @type {(r: any) => number} */ f) => round(mean(recs.map(f).filter(Number.isFinite)), 1);
  return { queueMs: m((r) => r.queueMs), kvWaitMs: m((r) => r.kvWaitMs), transferMs: m((r) => r.transferMs), ownFirstTokenMs: m((r) => r.decodeFirstTokenMs) };
}

/**
 * Where the time to first token goes, as means in simulated ms (they add up to the mean TTFT):
 * waiting at the edge; queued at the engine that computed the prompt (P, or the node serving
 * alone), of which waiting for KV memory there; computing it (P's prefill, or the node's prefill
 * and first token); and, when disaggregated, what follows P: the decode node's wait (for KV
 * memory too), the KV pull and its first step.
 * @param {AgenticOutcome[]} ok @param {Map<string, any>} answered @param {Map<string, any>} prefilled
 * @param {(o: AgenticOutcome) => number} edge
 */
export function ttftBreakdown(ok, answered, prefilled, edge) {
  let edgeMs = 0;
  let queue = 0;
  let queueKv = 0;
  let compute = 0;
  let handoff = 0;
  let handoffKv = 0;
  for (const o of ok) {
    const a = answered.get(o.id);
    const p = prefilled.get(o.id);
    edgeMs += edge(o);
    if (!p || p === a) {
      // served alone: its queue, then prefill and first token
      const q = Math.min(a.ttftMs, a.queueMs ?? 0);
      queue += q;
      queueKv += Math.min(q, a.kvWaitMs ?? 0);
      compute += a.ttftMs - q;
      continue;
    }
    const q = p.queueMs ?? 0;
    const pre = p.prefillMs ?? 0;
    queue += q;
    queueKv += Math.min(q, p.kvWaitMs ?? 0);
    compute += pre;
    const rest = Math.max(0, a.ttftMs - q - pre);
    handoff += rest;
    // D took its blocks when the request arrived (Mooncake): its KV wait overlaps P's work
    handoffKv += Math.min(rest, Math.max(0, (a.kvWaitMs ?? 0) - q - pre));
  }
  const n = Math.max(1, ok.length);
  const r = (/** @type {number} */ x) => round(x / n, 1);
  return {
    edgeMs: r(edgeMs),
    queueMs: r(queue),
    queueKvMs: r(queueKv),
    prefillMs: r(compute),
    handoffMs: r(handoff),
    handoffKvMs: r(handoffKv),
    ttftMeanMs: r(edgeMs + queue + compute + handoff),
  };
}

/** Ours against the published ratios (seed 002). @param {Record<string, any>[]} results */
export function agenticComparisons(results) {
  const by = Object.fromEntries(results.map((r) => [r.name, r]));
  return comparePairs(by, /** @type {Record<string, Record<string, number>>} */ (SEED002.configs), [
    ['colocated-8/round_robin', 'colocated-8/cache_aware', 'ttftP50Ms', 'TTFT p50: colocated round-robin / cache-aware'],
    ['pd-4p4d/cache_aware', 'colocated-8/cache_aware', 'ttftP50Ms', 'TTFT p50: PD 4P+4D / colocated cache-aware'],
    ['pd-6p2d/cache_aware', 'colocated-8/cache_aware', 'ttftP50Ms', 'TTFT p50: PD 6P+2D / colocated cache-aware'],
    ['pd-6p2d/cache_aware', 'pd-4p4d/cache_aware', 'ttftP50Ms', 'TTFT p50: PD 6P+2D / PD 4P+4D'],
    ['colocated-8/round_robin', 'colocated-8/cache_aware', 'tpotP90Ms', 'TPOT p90: colocated round-robin / cache-aware'],
    ['colocated-8/cache_aware', 'colocated-8/round_robin', 'hitRatio', 'APC: colocated cache-aware / round-robin'],
    ['colocated-8/cache_aware', 'pd-4p4d/cache_aware', 'hitRatio', 'APC: colocated cache-aware / PD 4P+4D'],
  ]);
}

/**
 * The tables a run prints, from its report alone (`npm run bench -- docs` rebuilds them from the JSON).
 * @param {{ profile: any, results: Record<string, any>[], comparisons: any[], skipped: { name: string, why: string }[] }} report
 */
export function agenticMarkdown({ profile, results, comparisons, skipped }) {
  const notRun = skipped.length ? `\n\nnot run: ${skipped.map((s) => `${s.name} (${s.why})`).join('; ')}` : '';
  return `${profileTable(profile)}\n\n${agenticTable(results)}\n\n${ttftTable(results)}\n\n${comparisonsTable(comparisons)}${notRun}`;
}

/** @param {ReturnType<typeof agenticProfile>} p */
function profileTable(p) {
  // runs before the trace kept its hit buckets (agentic-thresholds.json) leave the cell empty
  const b = (/** @type {Record<string, { share: number, newTokens: number }> | undefined} */ h) =>
    h && ['cold', '1-50%', '50-90%', '>90%'].map((k) => `${Math.round(h[k].share * 100)}% (${round(h[k].newTokens / 1000, 1)}k)`).join(' / ');
  return markdownTable(
    [
      'trace',
      'requests',
      'sessions',
      'single-turn sessions',
      'input mean / p50 / p90',
      'output mean / p50',
      'hit buckets cold / 1-50% / 50-90% / >90% (new tokens)',
      'infinite-cache ceiling',
    ],
    [
      ['published (seed 002)', '', '', '90%', '33.6k / 20k / 88k', '445 / 80', b(PUBLISHED_HIT_BUCKETS), '0.71 (whole 2-hour trace)'],
      [
        'ours',
        p.requests,
        p.sessions,
        `${Math.round(p.singleTurnSessionShare * 100)}%`,
        `${round(p.inputMean / 1000, 1)}k / ${round(p.inputP50 / 1000, 1)}k / ${round(p.inputP90 / 1000, 1)}k`,
        `${Math.round(p.outputMean)} / ${p.outputP50}`,
        b(p.hitBuckets),
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
      'ITL p50 / p99 ms',
      'E2E p50 s',
      'APC',
      'decode KV peak / mean (ceiling of the closed loop)',
      'TTFT share waiting for KV',
      'waited at the edge: requests / p90 / max s',
      'local / disaggregated',
      'completed (failed)',
      'preemptions',
      'router p50 (sim ms)',
      'wall s',
    ],
    results.map((r) => [
      // runs before dispatch and ITL were kept (agentic-thresholds.json) show neither
      r.dispatch ? `${r.name} (${r.dispatch})` : r.name,
      `${round(r.ttftP50Ms / 1000, 3)} / ${round(r.ttftP90Ms / 1000, 3)}`,
      r.tpotP90Ms,
      r.itlP50Ms === undefined ? '' : `${r.itlP50Ms} / ${r.itlP99Ms}`,
      round(r.e2eP50Ms / 1000, 2),
      r.hitRatio,
      `${r.decodeKvPeak} / ${r.decodeKvMean}${r.decodeKvCeiling ? ` (${r.decodeKvCeiling.peak} / ${r.decodeKvCeiling.mean})` : ''}`,
      r.kvWaitShare,
      r.edgeQueued ? `${r.edgeQueued} / ${round(r.edgeQueueP90Ms / 1000, 2)} / ${round(r.edgeQueueMaxMs / 1000, 2)}` : '0',
      r.modes.local || r.disaggregation === 'conditional' ? `${r.modes.local ?? 0} / ${r.modes.disaggregated ?? 0}` : '',
      `${r.completed} (${r.failed}${r.notSent ? `, ${r.notSent} not sent` : ''})`,
      r.preemptions,
      r.routerOverheadSimP50Ms,
      r.wallS,
    ]),
  );
}

/** Where the TTFT goes, per configuration (means, simulated s). @param {Record<string, any>[]} results */
function ttftTable(results) {
  const s = (/** @type {number} */ ms) => round(ms / 1000, 3);
  return markdownTable(
    [
      'config (TTFT means, s)',
      'TTFT',
      'at the edge',
      'queued at the prefilling engine (of it for KV)',
      'prefill',
      'after P: D waits, pulls, first step (of it for KV)',
      'decisions',
    ],
    results.map((r) => {
      const b = r.ttftBreakdown;
      return [
        r.name,
        s(b.ttftMeanMs),
        s(b.edgeMs),
        `${s(b.queueMs)} (${s(b.queueKvMs)})`,
        s(b.prefillMs),
        r.protocol === 'colocated' ? '' : `${s(b.handoffMs)} (${s(b.handoffKvMs)})`,
        Object.entries(r.decisions)
          .map(([k, n]) => `${k} ${n}`)
          .join(', '),
      ];
    }),
  );
}
