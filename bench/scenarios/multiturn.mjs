// `multiturn` (seed 000): 2P+2D vllm on the seed000 preset (H200, 400G IB a GPU, Qwen3-14B bf16),
// conversations of several turns, each turn the whole history plus a new user message. Per
// configuration: does the policy keep a conversation on the nodes that hold its prefix, and what
// does that do to decode: full-context re-pulls of KV onto D collide with its decode steps (ITL,
// TPOT) and cost throughput. Configurations: round_robin, P affinity with D round-robin, P+D
// affinity (and optionally cache_aware), plus a 1P+1D isolation baseline.
//
// Time: the engines run on the cluster's simulated clock (--time-scale real ms per simulated ms,
// 0.5 by default). Latencies are the engines' own simulated figures (TTFT composed from P's queue
// and prefill, D's wait, pull and first step: the router's time between legs is not in it);
// throughput is output tokens over the simulated span of the run, which does include the router's
// real time scaled up (reported: its share is small at this scale).
import { engineOverrides, listOption, numberOption } from '../lib/args.mjs';
import { startStack } from '../lib/harness.mjs';
import { postJsonRetrying, createAgent } from '../lib/http-client.mjs';
import { markdownTable } from '../lib/report.mjs';
import { SEED000, comparePairs, compareRatio, comparisonsTable } from '../lib/seeds.mjs';
import { mean, percentile, round } from '../lib/stats.mjs';
import { seededText } from '../lib/text.mjs';

const CHARS_PER_TOKEN = 4;
/** shared by every conversation: realistic, and a shared system prompt must not decide */
const SYSTEM_PROMPT = 'You are a helpful assistant. Answer precisely and keep answers short.';

/**
 * The configurations, as data: a name, the cluster document's policy, how many P and D, and the
 * share of the workload's clients and conversations it runs (the 1P+1D baseline runs half of
 * them: the same load a pair as 2P+2D, so a P/D pair works in isolation from the others).
 * @type {Record<string, { policy: Record<string, string>, prefill: number, decode: number, label: string, loadShare?: number }>}
 */
export const MULTITURN_CONFIGS = {
  round_robin: { policy: { prefill: 'round_robin', decode: 'round_robin' }, prefill: 2, decode: 2, label: 'round-robin' },
  p_affinity: { policy: { prefill: 'affinity', decode: 'round_robin' }, prefill: 2, decode: 2, label: 'P affinity, D round-robin' },
  pd_affinity: { policy: { prefill: 'affinity', decode: 'affinity' }, prefill: 2, decode: 2, label: 'P+D affinity' },
  cache_aware: { policy: { prefill: 'cache_aware', decode: 'cache_aware' }, prefill: 2, decode: 2, label: 'cache_aware' },
  // conditional disaggregation (issue 17): D first, a turn whose prompt D mostly holds is prefilled there alone
  pd_affinity_conditional: {
    policy: { prefill: 'affinity', decode: 'affinity', disaggregation: 'conditional' },
    prefill: 2,
    decode: 2,
    label: 'P+D affinity, conditional disaggregation',
  },
  // the same with the local-prefill threshold above a turn's new tokens (2,048 + the answer): D
  // prefills every later turn itself (sensitivity: what the threshold protects)
  pd_affinity_conditional_4k: {
    policy: { prefill: 'affinity', decode: 'affinity', disaggregation: 'conditional', localPrefillTokens: 4096 },
    prefill: 2,
    decode: 2,
    label: 'P+D affinity, conditional, localPrefillTokens 4096',
  },
  // predicted disaggregation (issue 23, SPEC 9): each turn decides by predicted TTFT between P then D and D alone
  pd_affinity_predicted: {
    policy: { prefill: 'affinity', decode: 'affinity', disaggregation: 'predicted' },
    prefill: 2,
    decode: 2,
    label: 'P+D affinity, predicted disaggregation',
  },
  isolation_1p1d: { policy: { prefill: 'affinity', decode: 'affinity' }, prefill: 1, decode: 1, label: '1P+1D isolation baseline', loadShare: 0.5 },
};
const DEFAULT_CONFIGS = ['round_robin', 'p_affinity', 'pd_affinity', 'isolation_1p1d'];

/**
 * @param {Record<string, string | true>} options
 */
export function multiturnConfig(options) {
  const quick = options.quick === true;
  return {
    configs: listOption(options, 'config', Object.keys(MULTITURN_CONFIGS), DEFAULT_CONFIGS),
    preset: typeof options.preset === 'string' ? options.preset : 'seed000',
    conversations: numberOption(options, 'conversations', quick ? 16 : 60),
    turns: numberOption(options, 'turns', quick ? 4 : 5),
    firstTurnTokens: numberOption(options, 'first-turn-tokens', 8192),
    turnTokens: numberOption(options, 'turn-tokens', 2048),
    outputTokens: numberOption(options, 'output-tokens', quick ? 64 : 128),
    concurrency: numberOption(options, 'concurrency', quick ? 8 : 12),
    timeScale: numberOption(options, 'time-scale', quick ? 0.1 : 0.5),
    // --router-time real: the router's real time passes as simulated time; default held: the clock
    // stands while the router has a turn in hand (sim/model/router-holds.mjs, agentic.mjs alike)
    routerTime: options['router-time'] === 'real' ? 'real' : 'held',
    engine: engineOverrides(options),
    quick,
  };
}

/**
 * Run the conversations against a router; each turn appends the answer and a new user message.
 * @param {string} routerUrl
 * @param {{ conversations: number, turns: number, firstTurnTokens: number, turnTokens: number, outputTokens: number, concurrency: number }} cfg
 * @param {string} [idPrefix] x-request-id prefix
 * @param {import('../../sim/model/router-holds.mjs').RouterHolds} [holds] told when a turn is sent and answered
 */
export async function runConversations(routerUrl, cfg, idPrefix = '', holds = undefined) {
  const agent = createAgent(cfg.concurrency);
  /** @type {{ conv: number, turn: number, status: number, error?: string, ttfbMs: number, totalMs: number, retries: number, cachedTokens: number, promptTokens: number, prefill?: string, decode?: string, mode?: string, routerHeldMs?: number }[]} */
  const turns = [];
  let nextConv = 0;
  const worker = async () => {
    while (nextConv < cfg.conversations) {
      const c = nextConv++;
      /** @type {{ role: string, content: string }[]} */
      const messages = [{ role: 'system', content: SYSTEM_PROMPT }];
      for (let t = 1; t <= cfg.turns; t++) {
        const tokens = t === 1 ? cfg.firstTurnTokens : cfg.turnTokens;
        messages.push({ role: 'user', content: seededText(c * 1000 + t, tokens * CHARS_PER_TOKEN, `conversation ${c} turn ${t}:`) });
        const id = `${idPrefix}conv${c}-turn${t}`;
        holds?.sent(id);
        const res = await postJsonRetrying(
          `${routerUrl}/v1/chat/completions`,
          { model: 'sim-model', messages, stream: true, stream_options: { include_usage: true }, max_tokens: cfg.outputTokens },
          { agent, headers: { 'x-request-id': id } },
        );
        const routerHeldMs = holds?.answered(id);
        turns.push({
          conv: c,
          turn: t,
          status: res.status,
          error: res.error ?? (res.status === 200 ? undefined : `HTTP ${res.status}: ${JSON.stringify(res.json ?? '').slice(0, 200)}`),
          ttfbMs: res.ttfbMs,
          totalMs: res.totalMs,
          retries: res.retries ?? 0,
          routerHeldMs,
          cachedTokens: res.usage?.prompt_tokens_details?.cached_tokens ?? 0,
          promptTokens: res.usage?.prompt_tokens ?? 0,
          prefill: /** @type {string | undefined} */ (res.headers['x-pd-prefill']),
          decode: /** @type {string | undefined} */ (res.headers['x-pd-decode']),
          mode: /** @type {string | undefined} */ (res.headers['x-pd-mode']),
        });
        if (res.status !== 200) break; // the history would be wrong from here on
        messages.push({ role: 'assistant', content: res.text ?? '' });
      }
    }
  };
  await Promise.all(Array.from({ length: cfg.concurrency }, worker));
  agent.destroy();
  return turns;
}

/** The engines of a configuration. @param {{ prefill: number, decode: number }} c */
function enginesOf(c) {
  return [
    ...Array.from({ length: c.prefill }, (_, i) => ({ id: `p${i}`, role: /** @type {const} */ ('prefill') })),
    ...Array.from({ length: c.decode }, (_, i) => ({ id: `d${i}`, role: /** @type {const} */ ('decode') })),
  ];
}

/** @param {Record<string, string | true>} options */
export async function runMultiturn(options) {
  const cfg = multiturnConfig(options);
  const results = [];
  for (const name of cfg.configs) {
    const c = MULTITURN_CONFIGS[name];
    const t0 = performance.now();
    const stack = await startStack({
      engines: enginesOf(c),
      defaults: { timeScale: cfg.timeScale, preset: cfg.preset, ...cfg.engine },
      clusterDocument: (started) => ({
        protocol: 'vllm',
        policy: c.policy,
        nodes: [...started.values()].map((e) => ({ id: e.id, url: e.url, role: e.role })),
      }),
    });
    try {
      const started = performance.now();
      const simStart = stack.simNowMs();
      const share = c.loadShare ?? 1;
      const turns = await runConversations(
        stack.router.url,
        {
          ...cfg,
          conversations: Math.max(1, Math.round(cfg.conversations * share)),
          concurrency: Math.max(1, Math.round(cfg.concurrency * share)),
        },
        '',
        cfg.routerTime === 'held' ? stack.time().holds : undefined,
      );
      const simSpanMs = stack.simNowMs() - simStart;
      const wallS = (performance.now() - started) / 1000;
      const stats = await stack.stats();
      const perRequest = await stack.requestStats();
      results.push({
        config: name,
        policy: name,
        label: c.label,
        nodes: `${c.prefill}P+${c.decode}D`,
        concurrency: Math.max(1, Math.round(cfg.concurrency * (c.loadShare ?? 1))),
        ...multiturnFigures({ turns, stats, perRequest, wallS, simSpanMs, timeScale: cfg.timeScale, concurrency: Math.max(1, Math.round(cfg.concurrency * share)) }),
        totalS: round((performance.now() - t0) / 1000, 1),
        routerTime: { mode: cfg.routerTime, heldS: round(stack.time().clock.heldRealMs / 1000, 1), holds: stack.time().holds.holds, capped: stack.time().holds.capped },
      });
      process.stderr.write(`multiturn ${name}: ${round(wallS, 1)} s\n`);
    } finally {
      await stack.close();
    }
  }
  const comparisons = multiturnComparisons(results);
  const report = { scenario: 'multiturn', config: cfg, results, comparisons, published: SEED000 };
  return {
    report,
    table: multiturnMarkdown(report),
    chart: {
      title: `multiturn (seed 000): ${cfg.conversations} conversations x ${cfg.turns} turns, H200 + Qwen3-14B (simulated)`,
      series: results.map((r) => r.config),
      figures: [
        { name: 'out tok/s (sim)', values: results.map((r) => r.outTokPerS) },
        { name: 'ITL p99 (sim ms)', values: results.map((r) => r.itlP99Ms) },
        { name: 'TPOT p99 (sim ms)', values: results.map((r) => r.tpotP99Ms) },
        { name: 'D full re-pulls', values: results.map((r) => r.decodeFullRepulls) },
        { name: 'P cross-node fetches', values: results.map((r) => r.prefillCrossNodeFetches) },
      ],
    },
  };
}

/**
 * @param {object} input
 * @param {{ conv: number, turn: number, status: number, error?: string, totalMs?: number, mode?: string, routerHeldMs?: number }[]} input.turns
 * @param {Record<string, any>} input.stats engine id -> engine stats
 * @param {Record<string, Record<string, any>>} input.perRequest x-request-id -> engine id -> leg figures
 * @param {number} input.wallS
 * @param {number} input.simSpanMs the run's span on the cluster's simulated clock
 * @param {number} input.timeScale real ms per simulated ms
 * @param {number} input.concurrency clients sending turns
 */
export function multiturnFigures({ turns, stats, perRequest, wallS, simSpanMs, timeScale, concurrency }) {
  const engines = Object.values(stats);
  const ps = engines.filter((e) => e.role === 'prefill');
  const ds = engines.filter((e) => e.role === 'decode');
  const sum = (/** @type {any[]} */ list, /** @type {(e: any) => number} */ f) => list.reduce((a, e) => a + f(e), 0);
  let afterFirst = 0;
  let withMiss = 0;
  let withPMiss = 0;
  let withDMiss = 0;
  let fullRepullsAfterFirst = 0;
  let fetchesAfterFirst = 0;
  let fetchesFromDecode = 0;
  for (const [id, legs] of Object.entries(perRequest)) {
    // the router's upstream id is the client's x-request-id plus a per-attempt suffix (unique ids, issue 10)
    const m = /turn(\d+)(?:-[0-9a-f]{8}[0-9a-z]{1,2})?$/.exec(id);
    if (!m || Number(m[1]) <= 1) continue;
    afterFirst++;
    const list = Object.entries(legs).map(([engineId, rec]) => ({ role: stats[engineId]?.role, ...rec }));
    const pMiss = list.some((r) => r.role === 'prefill' && r.localityMissBlocks > 0);
    const dMiss = list.some((r) => r.role === 'decode' && r.localityMissBlocks > 0);
    if (pMiss) withPMiss++;
    if (dMiss) withDMiss++;
    if (pMiss || dMiss) withMiss++;
    if (list.some((r) => r.role === 'decode' && r.fullRepull)) fullRepullsAfterFirst++;
    if (list.some((r) => r.role === 'prefill' && (r.prefixFetchedUnits ?? 0) > 0)) fetchesAfterFirst++;
    if (list.some((r) => r.role === 'prefill' && (r.prefixFetchedUnits ?? 0) > 0 && stats[r.prefixFetchFrom]?.role === 'decode')) fetchesFromDecode++;
  }
  const ttft = ds.flatMap((e) => e.ttftMs);
  const tpot = ds.flatMap((e) => e.tpotMs);
  const itl = ds.flatMap((e) => e.itlMs);
  const outputTokens = sum(ds, (e) => e.outputTokens);
  const dBusy = sum(ds, (e) => e.busyMs);
  // The router's own time in a turn, in simulated ms as it would have passed: with the clock held
  // (--router-time held) the real ms the router had the turn in hand, else what the client waited
  // (real ms) beyond the engines' simulated time for it (P's queue and prefill, D's wait, pull and decode).
  /** @type {Map<string, number>} */
  const e2eByTurn = new Map();
  for (const [id, legs] of Object.entries(perRequest)) {
    const m = /(conv\d+-turn\d+)/.exec(id);
    // the answering leg: D's, or D prefilling alone (conditional disaggregation: no KV handle, the
    // engine's colocated path)
    for (const rec of Object.values(legs)) if (m && (rec.leg === 'vllmDecode' || rec.leg === 'colocated') && rec.e2eMs !== undefined) e2eByTurn.set(m[1], rec.e2eMs);
  }
  const overheadSimMs = [];
  const overheadShare = [];
  for (const t of turns) {
    const e2e = e2eByTurn.get(`conv${t.conv}-turn${t.turn}`);
    if (e2e === undefined || t.totalMs === undefined) continue;
    const overhead = t.routerHeldMs !== undefined ? t.routerHeldMs / timeScale : Math.max(0, t.totalMs / timeScale - e2e);
    overheadSimMs.push(overhead);
    overheadShare.push(overhead / (overhead + e2e));
  }
  return {
    requests: turns.length,
    errors: turns.filter((t) => t.status !== 200 || t.error).length,
    devProxyRetries: turns.reduce((a, t) => a + /** @type {any} */ (t.retries ?? 0), 0),
    errorSamples: [...new Set(turns.filter((t) => t.error).map((t) => `${t.status} ${t.error}`))].slice(0, 5),
    pHitRatio: round(
      sum(ps, (e) => e.cachedTokens) /
        Math.max(
          1,
          sum(ps, (e) => e.promptTokens),
        ),
      4,
    ),
    pLocalityMissBlocks: sum(ps, (e) => e.localityMissBlocks),
    dLocalityMissBlocks: sum(ds, (e) => e.localityMissBlocks),
    turnsAfterFirst: afterFirst,
    turnsWithLocalityMissAfterFirst: withMiss,
    // P legs after the first turn that fetched a held prefix from another node (seed 000's KV
    // mesh, the seed000 preset's prefixMesh); 0 on presets whose P recomputes it
    prefillCrossNodeFetches: fetchesAfterFirst,
    prefillFetchesFromDecode: fetchesFromDecode,
    // P legs after the first turn whose prefix another node held (fetched or recomputed)
    pLocalityMissTurns: withPMiss,
    pFetchedUnits: sum(ps, (e) => e.prefixFetchedUnits ?? 0),
    turnsWithDLocalityMissAfterFirst: withDMiss,
    // every pull that moved a decode node's whole context (the first turn's included)
    decodeFullRepulls: sum(ds, (e) => e.fullRepulls),
    dFullRepullsAfterFirst: fullRepullsAfterFirst,
    dSuffixPulls: sum(ds, (e) => e.suffixPulls),
    dBlocksPulled: sum(ds, (e) => e.blocksPulled),
    ttftP50Ms: round(percentile(ttft, 50), 1),
    ttftP99Ms: round(percentile(ttft, 99), 1),
    tpotP50Ms: round(percentile(tpot, 50), 2),
    tpotP99Ms: round(percentile(tpot, 99), 2),
    itlP50Ms: round(percentile(itl, 50), 2),
    itlP99Ms: round(percentile(itl, 99), 2),
    meanItlMs: round(mean(itl), 2),
    // share of D's step time lost to KV landing on it (seed 000's collision)
    dLandingShare: round(sum(ds, (e) => e.ingestStallMs) / Math.max(1, dBusy), 4),
    // ... and in simulated ms: the decode steps' time spent landing KV
    dLandingMs: round(
      sum(ds, (e) => e.ingestStallMs),
      1,
    ),
    dKvPeak: round(Math.max(...ds.map((e) => e.kvUsagePeak)), 3),
    outputTokens,
    simSpanS: round(simSpanMs / 1000, 1),
    // the cluster's throughput by construction: concurrency x tokens a turn / a turn's simulated
    // time at the engines (Little's law), so the router's real time is not in it
    outTokPerS: round((concurrency * (outputTokens / Math.max(1, e2eByTurn.size))) / (mean([...e2eByTurn.values()]) / 1000), 1),
    // the same over the run's simulated span, the router's time (scaled) included
    outTokPerSWithRouter: round(outputTokens / (simSpanMs / 1000), 1),
    routerOverheadSimP50Ms: round(percentile(overheadSimMs, 50), 1),
    routerOverheadShareP50: round(percentile(overheadShare, 50), 4),
    pRequests: ps.map((e) => e.requests.vllmPrefill),
    dRequests: ds.map((e) => e.requests.vllmDecode + e.requests.colocated),
    // turns D prefilled alone (route receipt x-pd-mode: local)
    localTurns: turns.filter((t) => t.mode === 'local').length,
    wallS: round(wallS, 2),
  };
}

/** Ours against the published ratios (seed 000). @param {Record<string, any>[]} results */
export function multiturnComparisons(results) {
  const by = Object.fromEntries(results.map((r) => [r.config, r]));
  /** @type {ReturnType<typeof compareRatio>[]} */
  const out = comparePairs(by, /** @type {any} */ (SEED000.configs), [
    ['round_robin', 'pd_affinity', 'itlP99Ms', 'ITL p99: round-robin / P+D affinity'],
    ['p_affinity', 'pd_affinity', 'itlP99Ms', 'ITL p99: P affinity / P+D affinity'],
    ['round_robin', 'p_affinity', 'itlP99Ms', 'ITL p99: round-robin / P affinity'],
    ['round_robin', 'pd_affinity', 'tpotP99Ms', 'TPOT p99: round-robin / P+D affinity'],
    ['p_affinity', 'pd_affinity', 'tpotP99Ms', 'TPOT p99: P affinity / P+D affinity'],
    ['pd_affinity', 'round_robin', 'outTokPerS', 'out tok/s: P+D affinity / round-robin'],
    ['pd_affinity', 'p_affinity', 'outTokPerS', 'out tok/s: P+D affinity / P affinity'],
    ['pd_affinity', 'isolation_1p1d', 'itlP99Ms', 'ITL p99: P+D affinity / 1P+1D baseline'],
    ['pd_affinity', 'isolation_1p1d', 'outTokPerS', 'out tok/s: P+D affinity (2P+2D) / 1P+1D baseline'],
  ]);
  const counts = SEED000.counts;
  if (by.round_robin && by.pd_affinity) {
    out.push(
      compareRatio(
        'D full re-pulls after the first turn: round-robin / P+D affinity',
        counts.decodeFullRepulls.round_robin,
        counts.decodeFullRepulls.pd_affinity,
        by.round_robin.dFullRepullsAfterFirst,
        by.pd_affinity.dFullRepullsAfterFirst,
      ),
    );
    out.push(
      compareRatio(
        'P cross-node prefix fetches: round-robin / P+D affinity',
        counts.prefillCrossNodeFetches.round_robin,
        counts.prefillCrossNodeFetches.pd_affinity,
        by.round_robin.prefillCrossNodeFetches,
        // a count of 0 stays 0 (the ratio is infinite), not 1
        by.pd_affinity.prefillCrossNodeFetches,
      ),
    );
  }
  return out;
}

/**
 * The tables a run prints, from its report alone (`npm run bench -- docs` rebuilds them from the JSON).
 * @param {{ results: Record<string, any>[], comparisons: any[] }} report
 */
export function multiturnMarkdown(report) {
  return `${multiturnTable(report.results)}\n\n${comparisonsTable(report.comparisons)}`;
}

/** @param {Record<string, any>[]} results */
function multiturnTable(results) {
  return markdownTable(
    [
      'config',
      'nodes (clients)',
      'out tok/s (sim; with router)',
      'TPOT p50/p99 ms',
      'ITL p50/p99 ms',
      'TTFT p50/p99 ms',
      'P cross-node fetches',
      'D full re-pulls (turns>1)',
      'D suffix pulls',
      'D step time lost to landing KV',
      'P hit ratio',
      'D KV peak',
      'P reqs',
      'D reqs (of them local)',
      'router overhead p50 (sim ms, share of a turn)',
      'errors (retried)',
      'sim s / wall s',
    ],
    results.map((r) => [
      r.config,
      `${r.nodes} (${r.concurrency})`,
      `${r.outTokPerS} (${r.outTokPerSWithRouter})`,
      `${r.tpotP50Ms} / ${r.tpotP99Ms}`,
      `${r.itlP50Ms} / ${r.itlP99Ms}`,
      `${r.ttftP50Ms} / ${r.ttftP99Ms}`,
      `${r.prefillCrossNodeFetches}/${r.turnsAfterFirst}`,
      `${r.decodeFullRepulls} (${r.dFullRepullsAfterFirst})`,
      r.dSuffixPulls,
      r.dLandingShare,
      r.pHitRatio,
      r.dKvPeak,
      r.pRequests.join('/'),
      `${r.dRequests.join('/')} (${r.localTurns})`,
      `${r.routerOverheadSimP50Ms} (${r.routerOverheadShareP50})`,
      `${r.errors} (${r.devProxyRetries})`,
      `${r.simSpanS} / ${r.wallS}`,
    ]),
  );
}
