// `trace`: replay a Mooncake-format trace (hash_ids of 512-token blocks) in file order, with
// bounded concurrency, and compare each policy's prefix-cache hit ratio with the trace's ceiling.
import path from 'node:path';
import { listOption, numberOption, stringOption } from '../lib/args.mjs';
import { policyFor, startStack } from '../lib/harness.mjs';
import { createAgent, postJsonRetrying, runPool } from '../lib/http-client.mjs';
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
  for (const policy of policies) {
    const stack = await startStack({
      engines,
      defaults: { timeScale, cacheBlocks },
      clusterDocument: (started) => ({
        protocol,
        policy: policyFor(policy, Object.keys(cacheAware).length ? { cacheAware } : {}),
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
      await runPool(requests.length, concurrency, async (i) => {
        const r = requests[i];
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
      const stats = await stack.stats();
      const cachers = Object.values(stats).filter((e) => cacheRoles.includes(e.role));
      const engineCached = cachers.reduce((a, e) => a + e.cachedTokens, 0);
      const enginePrompt = cachers.reduce((a, e) => a + e.promptTokens, 0);
      const counts = Object.values(perNode);
      const hitRatio = cachedTokens / Math.max(1, promptTokens);
      results.push({
        policy,
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
      });
      process.stderr.write(`trace ${policy}: hit ratio ${round(hitRatio, 4)} in ${round(wallS, 1)} s\n`);
    } finally {
      await stack.close();
    }
  }
  const label = `${path.basename(file)}${Number.isFinite(limit) ? ` (first ${requests.length})` : ''}, ${nodes} nodes ${protocol}, ${cacheBlocks}-block LRU`;
  return {
    report: {
      scenario: 'trace',
      ceiling: round(ceiling.ratio, 4),
      config: { trace: file, requests: requests.length, nodes, cacheBlocks, protocol, concurrency, timeScale, cacheAware },
      results,
    },
    table:
      `ceiling (one infinite cache, blocks seen before / all blocks): ${round(ceiling.ratio, 4)} over ${requests.length} requests, ${ceiling.total} blocks\n\n` +
      markdownTable(
        ['policy', 'hit ratio', 'of ceiling', 'max/mean reqs', 'max/mean prefill tokens', 'requests per node', 'loc-miss blocks', 'errors (retried)', 'wall s', 'req/s'],
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
        ]),
      ),
    chart: {
      title: `trace: ${label}`,
      series: results.map((r) => r.policy),
      figures: [
        { name: 'hit ratio', values: results.map((r) => r.hitRatio), reference: { value: ceiling.ratio, label: `ceiling ${round(ceiling.ratio, 3)}` } },
        { name: 'max/mean requests per node', values: results.map((r) => r.maxOverMean), reference: { value: 1.1, label: 'target 1.10' } },
        { name: 'max/mean prefill tokens per node', values: results.map((r) => r.maxOverMeanTokens), reference: { value: 1.1, label: 'target 1.10' } },
      ],
    },
  };
}
