// `groups`: two groups (racks) of 2P+2D under affinity, with pdGroup off / prefer / strict: how
// often does the KV cross groups, and how evenly are the decode nodes loaded?
import { listOption } from '../lib/args.mjs';
import { policyFor, startStack } from '../lib/harness.mjs';
import { markdownTable } from '../lib/report.mjs';
import { maxOverMean, percentile, round } from '../lib/stats.mjs';
import { multiturnConfig, runConversations } from './multiturn.mjs';

const MODES = ['off', 'prefer', 'strict'];

/** @param {Record<string, string | true>} options */
export async function runGroups(options) {
  const modes = listOption(options, 'policy', MODES);
  // multiturn's workload, smaller by default: what matters here is where the legs go
  const cfg = multiturnConfig({
    conversations: '48',
    turns: '3',
    'first-turn-tokens': '2048',
    'turn-tokens': '512',
    'output-tokens': '64',
    concurrency: '16',
    'time-scale': '1',
    ...options,
    policy: 'affinity',
  });
  const engines = ['a', 'b'].flatMap((g) => [
    { id: `p${g}0`, role: /** @type {const} */ ('prefill'), group: g },
    { id: `p${g}1`, role: /** @type {const} */ ('prefill'), group: g },
    { id: `d${g}0`, role: /** @type {const} */ ('decode'), group: g },
    { id: `d${g}1`, role: /** @type {const} */ ('decode'), group: g },
  ]);
  const groupOf = Object.fromEntries(engines.map((e) => [e.id, e.group]));
  const results = [];
  for (const mode of modes) {
    const stack = await startStack({
      engines: engines.map(({ group, ...e }) => e),
      defaults: { timeScale: cfg.timeScale },
      clusterDocument: (started) => ({
        protocol: 'vllm',
        policy: policyFor('affinity', { pdGroup: mode }),
        nodes: [...started.values()].map((e) => ({ id: e.id, url: e.url, role: e.role, group: groupOf[e.id] })),
      }),
    });
    try {
      const started = performance.now();
      const turns = await runConversations(stack.router.url, cfg);
      const wallS = (performance.now() - started) / 1000;
      const stats = await stack.stats();
      const perRequest = await stack.requestStats();
      let decodeLegs = 0;
      let crossGroup = 0;
      for (const legs of Object.values(perRequest)) {
        for (const [engineId, rec] of Object.entries(legs)) {
          if (rec.leg !== 'vllmDecode' || rec.remoteEngineId === undefined) continue;
          decodeLegs++;
          if (groupOf[rec.remoteEngineId] !== groupOf[engineId]) crossGroup++;
        }
      }
      const ds = Object.values(stats).filter((e) => e.role === 'decode');
      const ps = Object.values(stats).filter((e) => e.role === 'prefill');
      const dCounts = ds.map((e) => e.requests.vllmDecode);
      const itl = ds.flatMap((e) => e.itlMs);
      const ttft = ds.flatMap((e) => e.ttftMs);
      results.push({
        policy: mode,
        crossGroupShare: round(crossGroup / Math.max(1, decodeLegs), 3),
        crossGroupLegs: crossGroup,
        decodeLegs,
        dMaxOverMean: round(maxOverMean(dCounts), 3),
        dRequests: Object.fromEntries(ds.map((e) => [e.id, e.requests.vllmDecode])),
        pRequests: Object.fromEntries(ps.map((e) => [e.id, e.requests.vllmPrefill])),
        pHitRatio: round(
          ps.reduce((a, e) => a + e.cachedTokens, 0) /
            Math.max(
              1,
              ps.reduce((a, e) => a + e.promptTokens, 0),
            ),
          4,
        ),
        ttftP99Ms: round(percentile(ttft, 99), 1),
        itlP99Ms: round(percentile(itl, 99), 1),
        errors: turns.filter((t) => t.status !== 200 || t.error).length,
        errorSamples: [...new Set(turns.filter((t) => t.error).map((t) => `${t.status} ${t.error}`))].slice(0, 5),
        devProxyRetries: turns.reduce((a, t) => a + /** @type {any} */ (t.retries ?? 0), 0),
        wallS: round(wallS, 1),
      });
      process.stderr.write(`groups ${mode}: ${round(wallS, 1)} s\n`);
    } finally {
      await stack.close();
    }
  }
  return {
    report: { scenario: 'groups', config: { ...cfg, policies: undefined, modes, policy: 'affinity' }, results },
    table: markdownTable(
      ['pdGroup', 'cross-group share', 'cross-group legs', 'D max/mean', 'D requests', 'P requests', 'P hit ratio', 'TTFT p99 ms', 'ITL p99 ms', 'errors (retried)', 'wall s'],
      results.map((r) => [
        r.policy,
        r.crossGroupShare,
        `${r.crossGroupLegs}/${r.decodeLegs}`,
        r.dMaxOverMean,
        Object.values(r.dRequests).join('/'),
        Object.values(r.pRequests).join('/'),
        r.pHitRatio,
        r.ttftP99Ms,
        r.itlP99Ms,
        `${r.errors} (${r.devProxyRetries})`,
        r.wallS,
      ]),
    ),
    chart: {
      title: 'groups: 2 x (2P+2D), affinity, by pdGroup mode',
      series: results.map((r) => r.policy),
      figures: [
        { name: 'cross-group transfer share', values: results.map((r) => r.crossGroupShare) },
        { name: 'D requests max/mean', values: results.map((r) => r.dMaxOverMean) },
      ],
    },
  };
}
