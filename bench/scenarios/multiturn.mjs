// `multiturn`: 2P+2D (vllm), conversations of several turns, each turn the whole history plus a
// new user message: does the policy keep a conversation on the nodes that hold its prefix?
import { listOption, numberOption } from '../lib/args.mjs';
import { policyFor, startStack } from '../lib/harness.mjs';
import { postJsonRetrying, createAgent } from '../lib/http-client.mjs';
import { markdownTable } from '../lib/report.mjs';
import { mean, percentile, round } from '../lib/stats.mjs';
import { seededText } from '../lib/text.mjs';

const CHARS_PER_TOKEN = 4;
/** the engines' defaults (sim/engine.mjs) */
const DECODE_BASE_MS = 15;
const TRANSFER_INTERFERENCE_MS = 20;
/** shared by every conversation: realistic, and a shared system prompt must not decide */
const SYSTEM_PROMPT = 'You are a helpful assistant. Answer precisely and keep answers short.';

/**
 * @param {Record<string, string | true>} options
 * @param {string[]} [fallbackPolicies]
 */
export function multiturnConfig(options) {
  return {
    policies: listOption(options),
    conversations: numberOption(options, 'conversations', 60),
    turns: numberOption(options, 'turns', 5),
    firstTurnTokens: numberOption(options, 'first-turn-tokens', 8192),
    turnTokens: numberOption(options, 'turn-tokens', 2048),
    outputTokens: numberOption(options, 'output-tokens', 128),
    concurrency: numberOption(options, 'concurrency', 12),
    timeScale: numberOption(options, 'time-scale', 1),
  };
}

/**
 * Run the conversations against a router; each turn appends the answer and a new user message.
 * @param {string} routerUrl
 * @param {ReturnType<typeof multiturnConfig>} cfg
 * @param {string} [idPrefix] x-request-id prefix
 */
export async function runConversations(routerUrl, cfg, idPrefix = '') {
  const agent = createAgent(cfg.concurrency);
  /** @type {{ conv: number, turn: number, status: number, error?: string, ttfbMs: number, retries: number, cachedTokens: number, promptTokens: number, prefill?: string, decode?: string }[]} */
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
        const res = await postJsonRetrying(
          `${routerUrl}/v1/chat/completions`,
          { model: 'sim-model', messages, stream: true, stream_options: { include_usage: true }, max_tokens: cfg.outputTokens },
          { agent, headers: { 'x-request-id': `${idPrefix}conv${c}-turn${t}` } },
        );
        turns.push({
          conv: c,
          turn: t,
          status: res.status,
          error: res.error ?? (res.status === 200 ? undefined : `HTTP ${res.status}: ${JSON.stringify(res.json ?? '').slice(0, 200)}`),
          ttfbMs: res.ttfbMs,
          retries: res.retries ?? 0,
          cachedTokens: res.usage?.prompt_tokens_details?.cached_tokens ?? 0,
          promptTokens: res.usage?.prompt_tokens ?? 0,
          prefill: /** @type {string | undefined} */ (res.headers['x-pd-prefill']),
          decode: /** @type {string | undefined} */ (res.headers['x-pd-decode']),
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

/** @param {Record<string, string | true>} options */
export async function runMultiturn(options) {
  const cfg = multiturnConfig(options);
  const engines = [
    { id: 'p0', role: /** @type {const} */ ('prefill') },
    { id: 'p1', role: /** @type {const} */ ('prefill') },
    { id: 'd0', role: /** @type {const} */ ('decode') },
    { id: 'd1', role: /** @type {const} */ ('decode') },
  ];
  const results = [];
  for (const policy of cfg.policies) {
    const t0 = performance.now();
    const stack = await startStack({
      engines,
      defaults: { timeScale: cfg.timeScale },
      clusterDocument: (started) => ({
        protocol: 'vllm',
        policy: policyFor(policy),
        nodes: [...started.values()].map((e) => ({ id: e.id, url: e.url, role: e.role })),
      }),
    });
    try {
      const started = performance.now();
      const turns = await runConversations(stack.router.url, cfg);
      const wallS = (performance.now() - started) / 1000;
      const stats = await stack.stats();
      const perRequest = await stack.requestStats();
      results.push({ policy, ...multiturnFigures({ turns, stats, perRequest, wallS, timeScale: cfg.timeScale }), totalS: round((performance.now() - t0) / 1000, 1) });
      process.stderr.write(`multiturn ${policy}: ${round(wallS, 1)} s\n`);
    } finally {
      await stack.close();
    }
  }
  return {
    report: { scenario: 'multiturn', config: cfg, results, targets: multiturnTargets(results) },
    table: multiturnTable(results) + '\n\n' + targetsTable(multiturnTargets(results)),
    chart: {
      title: `multiturn: 2P+2D, ${cfg.conversations} conversations x ${cfg.turns} turns`,
      series: results.map((r) => r.policy),
      figures: [
        { name: 'P hit ratio', values: results.map((r) => r.pHitRatio) },
        { name: 'turns>1 with locality miss', values: results.map((r) => r.turnsWithLocalityMissAfterFirst) },
        { name: 'D full re-pulls after turn 1', values: results.map((r) => r.dFullRepullsAfterFirst) },
        { name: 'ITL p99 (sim ms)', values: results.map((r) => r.itlP99Ms) },
        { name: 'TTFT p99 (sim ms)', values: results.map((r) => r.ttftP99Ms) },
      ],
    },
  };
}

/**
 * @param {object} input
 * @param {{ conv: number, turn: number, status: number, error?: string }[]} input.turns
 * @param {Record<string, any>} input.stats engine id -> engine stats
 * @param {Record<string, Record<string, any>>} input.perRequest x-request-id -> engine id -> leg figures
 * @param {number} input.wallS
 * @param {number} input.timeScale
 */
export function multiturnFigures({ turns, stats, perRequest, wallS, timeScale }) {
  const engines = Object.values(stats);
  const ps = engines.filter((e) => e.role === 'prefill');
  const ds = engines.filter((e) => e.role === 'decode');
  const sum = (/** @type {any[]} */ list, /** @type {(e: any) => number} */ f) => list.reduce((a, e) => a + f(e), 0);
  let afterFirst = 0;
  let withMiss = 0;
  let withPMiss = 0;
  let withDMiss = 0;
  let fullRepullsAfterFirst = 0;
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
  }
  const ttft = ds.flatMap((e) => e.ttftMs);
  const tpot = ds.flatMap((e) => e.tpotMs);
  const itl = ds.flatMap((e) => e.itlMs);
  const outputTokens = sum(ds, (e) => e.outputTokens);
  const dRequests = ds.map((e) => e.requests.vllmDecode);
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
    turnsWithPLocalityMissAfterFirst: withPMiss,
    turnsWithDLocalityMissAfterFirst: withDMiss,
    dFullRepulls: sum(ds, (e) => e.fullRepulls),
    dFullRepullsAfterFirst: fullRepullsAfterFirst,
    dSuffixPulls: sum(ds, (e) => e.suffixPulls),
    dBlocksPulled: sum(ds, (e) => e.blocksPulled),
    ttftP50Ms: round(percentile(ttft, 50), 1),
    ttftP99Ms: round(percentile(ttft, 99), 1),
    tpotP50Ms: round(percentile(tpot, 50), 2),
    tpotP99Ms: round(percentile(tpot, 99), 2),
    itlP50Ms: round(percentile(itl, 50), 1),
    itlP99Ms: round(percentile(itl, 99), 1),
    meanItlMs: round(mean(itl), 2),
    // decode steps slowed by a KV transfer on the same D (the engine adds transferInterferenceMs
    // to every step while any transfer runs; without it a step is decodeBaseMs + batch size)
    itlTransferSlowedShare: round(itl.filter((x) => x >= DECODE_BASE_MS + TRANSFER_INTERFERENCE_MS).length / Math.max(1, itl.length), 4),
    outputTokens,
    // simulated seconds = real seconds / time scale (router and client overhead scale up too)
    outputTokPerSimS: round(outputTokens / (wallS / timeScale), 1),
    outputTokPerS: round(outputTokens / wallS, 1),
    pRequests: ps.map((e) => e.requests.vllmPrefill),
    dRequests,
    wallS: round(wallS, 2),
  };
}

/** @param {Record<string, any>[]} results */
export function multiturnTargets(results) {
  const rr = results.find((r) => r.policy === 'round_robin');
  const aff = results.find((r) => r.policy === 'affinity');
  if (!rr || !aff) return [];
  return [
    {
      target: 'locality misses after the first turn near zero (published 30 -> 1)',
      roundRobin: rr.turnsWithLocalityMissAfterFirst,
      affinity: aff.turnsWithLocalityMissAfterFirst,
      met: aff.turnsWithLocalityMissAfterFirst <= Math.max(1, 0.05 * rr.turnsWithLocalityMissAfterFirst),
    },
    // a first turn's pull is a full pull under any policy; a RE-pull is one after the first turn
    {
      target: 'D full re-pulls (after the first turn) at least halved',
      roundRobin: rr.dFullRepullsAfterFirst,
      affinity: aff.dFullRepullsAfterFirst,
      met: aff.dFullRepullsAfterFirst * 2 <= rr.dFullRepullsAfterFirst,
    },
    { target: 'ITL p99 clearly lower (<= 0.9x)', roundRobin: rr.itlP99Ms, affinity: aff.itlP99Ms, met: aff.itlP99Ms <= 0.9 * rr.itlP99Ms },
  ];
}

/** @param {{ target: string, roundRobin: number, affinity: number, met: boolean }[]} targets */
export function targetsTable(targets) {
  if (targets.length === 0) return '';
  return markdownTable(
    ['target (affinity vs round_robin)', 'round_robin', 'affinity', 'met'],
    targets.map((t) => [t.target, t.roundRobin, t.affinity, t.met ? 'yes' : 'NO']),
  );
}

/** @param {Record<string, any>[]} results */
function multiturnTable(results) {
  return markdownTable(
    [
      'policy',
      'P hit ratio',
      'P loc-miss blocks',
      'D loc-miss blocks',
      'turns>1 w/ loc miss (P/D)',
      'D full pulls all (turns>1)',
      'D suffix pulls',
      'TTFT p50/p99 ms',
      'TPOT p50/p99 ms',
      'ITL p50/p99 ms',
      'steps slowed by transfer',
      'out tok/s (sim)',
      'P reqs',
      'D reqs',
      'errors (retried)',
      'wall s',
    ],
    results.map((r) => [
      r.policy,
      r.pHitRatio,
      r.pLocalityMissBlocks,
      r.dLocalityMissBlocks,
      `${r.turnsWithLocalityMissAfterFirst}/${r.turnsAfterFirst} (${r.turnsWithPLocalityMissAfterFirst}/${r.turnsWithDLocalityMissAfterFirst})`,
      `${r.dFullRepulls} (${r.dFullRepullsAfterFirst})`,
      r.dSuffixPulls,
      `${r.ttftP50Ms} / ${r.ttftP99Ms}`,
      `${r.tpotP50Ms} / ${r.tpotP99Ms}`,
      `${r.itlP50Ms} / ${r.itlP99Ms}`,
      r.itlTransferSlowedShare,
      r.outputTokPerSimS,
      r.pRequests.join('/'),
      r.dRequests.join('/'),
      `${r.errors} (${r.devProxyRetries})`,
      r.wallS,
    ]),
  );
}
