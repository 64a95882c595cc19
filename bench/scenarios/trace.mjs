// `trace`: replay a Mooncake-format trace (hash_ids of 512-token blocks) in file order, with
// bounded concurrency, and compare each policy's prefix-cache hit ratio with the trace's ceiling.
//
// Cache-hit feedback (issue 17): `--restart NODE@SHARE` restarts one engine through the
// simulator's control server once that share of the requests was sent (stop, its KV memory and
// prefix cache emptied, start: what a crash and restart, or /reset_prefix_cache, does to the
// engine); small `--cache-blocks` make the engines evict. `--feedback both` runs each policy with
// the router's cache-hit feedback and without it (the test-only TEST_CACHE_FEEDBACK=count_only:
// answers are counted, the prefix index is never corrected). Per run: the router's predicted vs
// the engines' reported cached tokens (pd_router_prefix_predicted_tokens_total /
// pd_router_prefix_cached_tokens_total), overall and after the restart, and the hit ratio.
import path from 'node:path';
import { listOption, numberOption, stringOption } from '../lib/args.mjs';
import { policyFor, startStack } from '../lib/harness.mjs';
import { createAgent, postJsonRetrying, runPool } from '../lib/http-client.mjs';
import { routerMetrics, sumBy, total } from '../lib/prometheus.mjs';
import { markdownTable } from '../lib/report.mjs';
import { maxOverMean, round } from '../lib/stats.mjs';
import { promptOfTraceRequest, readTrace, traceCeiling } from '../lib/trace.mjs';

/** @param {Record<string, string | true>} options */
export async function runTrace(options) {
  const file = stringOption(options, 'trace');
  if (!file) throw new Error('trace: --trace FILE is required (e.g. ../shared/data/mooncake_conversation.jsonl)');
  const nodes = numberOption(options, 'nodes', 8);
  const cacheBlocks = numberOption(options, 'cache-blocks', 5000);
  const protocol = stringOption(options, 'protocol', 'colocated');
  if (protocol !== 'colocated' && protocol !== 'vllm') throw new Error('--protocol must be colocated or vllm');
  const limit = numberOption(options, 'limit', Infinity);
  const concurrency = numberOption(options, 'concurrency', 16);
  const timeScale = numberOption(options, 'time-scale', 0);
  const policies = listOption(options);
  const restart = restartOption(stringOption(options, 'restart'));
  const feedbackModes = listOption(options, 'feedback', ['with', 'without', 'both'], ['with']).flatMap((m) => (m === 'both' ? ['with', 'without'] : [m]));
  const cellCounts = cellsOption(stringOption(options, 'cells'));
  /** @type {Record<string, number>} */
  const cacheAware = {};
  if (options['cache-aware-alpha'] !== undefined) cacheAware.loadAlpha = numberOption(options, 'cache-aware-alpha', 0.5);
  if (options['block-chars'] !== undefined) cacheAware.blockChars = numberOption(options, 'block-chars', 2048);

  const requests = readTrace(file, limit);
  const ceiling = traceCeiling(requests);
  /** @type {import('../lib/harness.mjs').EngineSpec[]} */
  const engines =
    protocol === 'colocated'
      ? Array.from({ length: nodes }, (_, i) => ({ id: `n${i}`, role: /** @type {const} */ ('both') }))
      : [
          ...Array.from({ length: nodes }, (_, i) => ({ id: `p${i}`, role: /** @type {const} */ ('prefill') })),
          ...Array.from({ length: nodes }, (_, i) => ({ id: `d${i}`, role: /** @type {const} */ ('decode') })),
        ];
  const cacheRoles = protocol === 'colocated' ? ['both'] : ['prefill'];

  const results = [];
  const runs = policies.flatMap((p) => feedbackModes.flatMap((f) => cellCounts.map((c) => /** @type {const} */ ([p, f, c]))));
  for (const [policy, feedback, cells] of runs) {
    const named = feedbackModes.length > 1 || feedback === 'without' ? `${policy}, ${feedback} feedback` : policy;
    // --cells: the pool cut into that many cells, each an object of its own (docs/scaling.md)
    const name = cellCounts.length > 1 || cells > 1 ? `${named}, ${cells} cell${cells === 1 ? '' : 's'}` : named;
    const stack = await startStack({
      engines,
      defaults: { timeScale, cacheBlocks },
      vars: feedback === 'without' ? { TEST_CACHE_FEEDBACK: 'count_only' } : {},
      clusterDocument: (started) => ({
        protocol,
        policy: policyFor(policy, Object.keys(cacheAware).length ? { cacheAware } : {}),
        ...(cells > 1 ? { cells } : {}),
        nodes: [...started.values()].map((e) => ({ id: e.id, url: e.url, role: e.role })),
      }),
    });
    try {
      const agent = createAgent(concurrency);
      let promptTokens = 0;
      let cachedTokens = 0;
      let errors = 0;
      let retries = 0;
      /** @type {Set<string>} */
      const errorSamples = new Set();
      /** @type {Record<string, number>} */
      const perNode = Object.fromEntries(engines.filter((e) => cacheRoles.includes(e.role)).map((e) => [e.id, 0]));
      /** prefill tokens each node computed (prompt tokens it did not have cached), from the answers' usage */
      /** @type {Record<string, number>} */
      const tokensPerNode = Object.fromEntries(Object.keys(perNode).map((id) => [id, 0]));
      const started = performance.now();
      let done = 0;
      const restartAt = restart ? Math.floor(restart.share * requests.length) : -1;
      /** @type {import('../lib/prometheus.mjs').Sample[] | undefined} */
      let beforeRestart;
      let afterPrompt = 0;
      let afterCached = 0;
      await runPool(requests.length, concurrency, async (i) => {
        const r = requests[i];
        if (restart && i === restartAt) {
          beforeRestart = await routerMetrics(stack.router.url);
          await restartEngine(stack.cluster.controlUrl, restart.node);
        }
        const res = await postJsonRetrying(
          `${stack.router.url}/v1/completions`,
          { model: 'sim-model', prompt: promptOfTraceRequest(r), max_tokens: Math.max(1, r.output_length), stream: false },
          { agent, headers: { 'x-request-id': `trace-${i}` } },
        );
        retries += res.retries ?? 0;
        if (res.status !== 200 || res.error) {
          errors++;
          if (errorSamples.size < 5) errorSamples.add(`${res.status} ${res.error ?? JSON.stringify(res.json).slice(0, 160)}`);
        } else {
          const prompt = res.json?.usage?.prompt_tokens ?? 0;
          const cached = res.json?.usage?.prompt_tokens_details?.cached_tokens ?? 0;
          promptTokens += prompt;
          cachedTokens += cached;
          if (restart && i >= restartAt) {
            afterPrompt += prompt;
            afterCached += cached;
          }
          const node = String(res.headers['x-pd-prefill'] ?? '');
          if (node in perNode) {
            perNode[node]++;
            tokensPerNode[node] += Math.max(0, prompt - cached);
          }
        }
        if (++done % 1000 === 0) process.stderr.write(`trace ${policy}: ${done}/${requests.length} (${round((performance.now() - started) / 1000, 1)} s)\n`);
      });
      const wallS = (performance.now() - started) / 1000;
      agent.destroy();
      const metrics = await routerMetrics(stack.router.url);
      const stats = await stack.stats();
      const cachers = Object.values(stats).filter((e) => cacheRoles.includes(e.role));
      const engineCached = cachers.reduce((a, e) => a + e.cachedTokens, 0);
      const enginePrompt = cachers.reduce((a, e) => a + e.promptTokens, 0);
      const counts = Object.values(perNode);
      const hitRatio = cachedTokens / Math.max(1, promptTokens);
      // the engines' highest KV use over the run: below kvBusy (0.9) on every node, no request reached a node above it
      const kvPeak = Math.max(0, ...Object.values(stats).map((e) => e.kvUsagePeak ?? 0));
      results.push({
        policy: name,
        feedback: feedback === 'with',
        cells,
        kvPeak: round(kvPeak, 3),
        hitRatio: round(hitRatio, 4),
        ofCeiling: round(hitRatio / ceiling.ratio, 3),
        maxOverMean: round(maxOverMean(counts), 3),
        maxOverMeanTokens: round(maxOverMean(Object.values(tokensPerNode)), 3),
        requestsPerNode: perNode,
        prefillTokensPerNode: tokensPerNode,
        engineHitRatio: round(engineCached / Math.max(1, enginePrompt), 4),
        localityMissBlocks: cachers.reduce((a, e) => a + e.localityMissBlocks, 0),
        promptTokens,
        cachedTokens,
        requests: requests.length,
        errors,
        devProxyRetries: retries,
        errorSamples: [...errorSamples],
        wallS: round(wallS, 1),
        requestsPerS: round(requests.length / wallS, 1),
        ...predictionFigures(metrics, beforeRestart, restart?.node),
        ...(restart ? { restart: { node: restart.node, atRequest: restartAt, hitRatioAfter: round(afterCached / Math.max(1, afterPrompt), 4) } } : {}),
      });
      process.stderr.write(`trace ${name}: hit ratio ${round(hitRatio, 4)} in ${round(wallS, 1)} s\n`);
    } finally {
      await stack.close();
    }
  }
  const label = `${path.basename(file)}${Number.isFinite(limit) ? ` (first ${requests.length})` : ''}, ${nodes} nodes ${protocol}, ${cacheBlocks}-block LRU`;
  const report = {
    scenario: 'trace',
    ceiling: round(ceiling.ratio, 4),
    ceilingBlocks: ceiling.total,
    config: { trace: file, requests: requests.length, nodes, cacheBlocks, protocol, concurrency, timeScale, cacheAware, restart, feedback: feedbackModes, cells: cellCounts },
    results,
  };
  return {
    report,
    table: traceMarkdown(report),
    chart: {
      title: `trace: ${label}`,
      series: results.map((r) => r.policy),
      figures: [
        { name: 'hit ratio', values: results.map((r) => r.hitRatio), reference: { value: ceiling.ratio, label: `ceiling ${round(ceiling.ratio, 3)}` } },
        { name: 'max/mean requests per node', values: results.map((r) => r.maxOverMean), reference: { value: 1.1, label: 'target 1.10' } },
        { name: 'max/mean prefill tokens per node', values: results.map((r) => r.maxOverMeanTokens), reference: { value: 1.1, label: 'target 1.10' } },
        ...(results.some((r) => r.predictedTokens > 0)
          ? [{ name: 'predicted / reported cached tokens', values: results.map((r) => r.predictedOverReported), reference: { value: 1, label: 'exact' } }]
          : []),
      ],
    },
  };
}

/**
 * The tables a run prints, from its report alone (`npm run bench -- docs` rebuilds them from the JSON;
 * runs before `ceilingBlocks` was kept leave the block count out).
 * @param {{ ceiling: number, ceilingBlocks?: number, config: { requests: number }, results: Record<string, any>[] }} report
 */
export function traceMarkdown({ ceiling, ceilingBlocks, config, results }) {
  const blocks = ceilingBlocks === undefined ? '' : `, ${ceilingBlocks} blocks`;
  // runs with --cells also show the engines' peak KV use (older reports have none)
  const kvPeak = results.some((r) => r.kvPeak !== undefined);
  return (
    `ceiling (one infinite cache, blocks seen before / all blocks): ${ceiling} over ${config.requests} requests${blocks}\n\n` +
    markdownTable(
      [
        'policy',
        'hit ratio',
        'of ceiling',
        'max/mean reqs',
        'max/mean prefill tokens',
        'requests per node',
        'loc-miss blocks',
        'errors (retried)',
        'wall s',
        'req/s',
        ...(kvPeak ? ['KV use peak'] : []),
      ],
      results.map((r) => [
        r.policy,
        r.hitRatio,
        r.ofCeiling,
        r.maxOverMean,
        r.maxOverMeanTokens,
        Object.values(r.requestsPerNode).join('/'),
        r.localityMissBlocks,
        `${r.errors} (${r.devProxyRetries})`,
        r.wallS,
        r.requestsPerS,
        ...(kvPeak ? [r.kvPeak] : []),
      ]),
    ) +
    (results.some((r) => r.predictedTokens > 0) ? `\n\n${predictionTable(results)}` : '')
  );
}

/** `--cells 1,2,4`: the cell counts to run each policy with (default 1: no cells). @param {string | undefined} v */
export function cellsOption(v) {
  if (v === undefined) return [1];
  const counts = v.split(',').map(Number);
  if (!counts.every((n) => Number.isInteger(n) && n >= 1 && n <= 64)) throw new Error('--cells N[,N...], each an integer from 1 to 64');
  return counts;
}

/** `--restart NODE@SHARE`, e.g. `n3@0.5`. @param {string | undefined} v */
export function restartOption(v) {
  if (v === undefined) return undefined;
  const m = /^([^@]+)@([0-9.]+)$/.exec(v);
  const share = m ? Number(m[2]) : NaN;
  if (!m || !(share > 0 && share < 1)) throw new Error('--restart NODE@SHARE, e.g. n3@0.5 (SHARE strictly between 0 and 1)');
  return { node: m[1], share };
}

/**
 * Restart one simulated engine: it stops listening (connections dropped, in-flight requests fail),
 * its KV memory and prefix cache are emptied, and it listens again on the same port.
 * @param {string} controlUrl @param {string} node
 */
async function restartEngine(controlUrl, node) {
  for (const action of ['stop', 'reset', 'start']) {
    const res = await fetch(`${controlUrl}/engines/${encodeURIComponent(node)}/${action}`, { method: 'POST' });
    if (!res.ok) throw new Error(`restart ${node}: ${action} answered ${res.status}`);
  }
  process.stderr.write(`trace: restarted ${node}\n`);
}

/**
 * The router's prediction against what the engines reported (summed over the run; and after the
 * restart, for every node and for the restarted one), and the caches it judged lost.
 * @param {import('../lib/prometheus.mjs').Sample[]} end the router's /metrics after the run
 * @param {import('../lib/prometheus.mjs').Sample[] | undefined} before ... just before the restart
 * @param {string | undefined} node the restarted node
 */
export function predictionFigures(end, before, node) {
  const predicted = sumBy(end, 'pd_router_prefix_predicted_tokens_total', ['node']);
  const reported = sumBy(end, 'pd_router_prefix_cached_tokens_total', ['node']);
  const sum = (/** @type {Record<string, number>} */ by) => Object.values(by).reduce((a, b) => a + b, 0);
  const ratio = (/** @type {number} */ a, /** @type {number} */ b) => (b > 0 ? round(a / b, 3) : NaN);
  const out = {
    predictedTokens: sum(predicted),
    reportedCachedTokens: sum(reported),
    predictedOverReported: ratio(sum(predicted), sum(reported)),
    cacheLost: total(end, 'pd_router_prefix_cache_lost_total'),
  };
  if (!before || !node) return out;
  const p0 = sumBy(before, 'pd_router_prefix_predicted_tokens_total', ['node']);
  const r0 = sumBy(before, 'pd_router_prefix_cached_tokens_total', ['node']);
  const afterPredicted = sum(predicted) - sum(p0);
  const afterReported = sum(reported) - sum(r0);
  const nodePredicted = (predicted[node] ?? 0) - (p0[node] ?? 0);
  const nodeReported = (reported[node] ?? 0) - (r0[node] ?? 0);
  return {
    ...out,
    afterRestart: {
      predictedTokens: afterPredicted,
      reportedCachedTokens: afterReported,
      predictedOverReported: ratio(afterPredicted, afterReported),
      node: { predictedTokens: nodePredicted, reportedCachedTokens: nodeReported, predictedOverReported: ratio(nodePredicted, nodeReported) },
      cacheLost: total(end, 'pd_router_prefix_cache_lost_total') - total(before, 'pd_router_prefix_cache_lost_total'),
    },
  };
}

/** Prediction against the engines' reports, with and without feedback. @param {Record<string, any>[]} results */
function predictionTable(results) {
  const tokens = (/** @type {number} */ n) => `${round(n / 1e6, 2)}M`;
  return markdownTable(
    [
      'policy',
      'hit ratio (after the restart)',
      'predicted / reported cached tokens',
      'after the restart: all nodes',
      'after the restart: the restarted node',
      'caches judged lost',
      'errors',
    ],
    results
      .filter((r) => r.predictedTokens > 0)
      .map((r) => {
        const a = r.afterRestart;
        return [
          r.policy,
          r.restart ? `${r.hitRatio} (${r.restart.hitRatioAfter})` : r.hitRatio,
          `${tokens(r.predictedTokens)} / ${tokens(r.reportedCachedTokens)} = ${r.predictedOverReported}`,
          a ? `${tokens(a.predictedTokens)} / ${tokens(a.reportedCachedTokens)} = ${a.predictedOverReported}` : '',
          a ? `${tokens(a.node.predictedTokens)} / ${tokens(a.node.reportedCachedTokens)} = ${a.node.predictedOverReported}` : '',
          r.cacheLost,
          r.errors,
        ];
      }),
  );
}
