// `groups` (seed 001): two groups (racks) of 2P+2D on the seed000 preset, under affinity with
// pdGroup off / prefer / strict. A transfer between groups crosses the spine: it gets a share of
// the link's rate and waits longer for its first byte (sim/model/fabric.mjs; the figures are in
// sim/presets.mjs). The cost of a cross-group transfer is latency on decode's first token: per
// mode, how often the KV crosses groups, how long transfers take in and across groups, the
// decode node's first-token latency (its wait, the pull, its first step), and how evenly the
// decode nodes are loaded.
import { engineOverrides, listOption } from '../lib/args.mjs';
import { policyFor, startStack } from '../lib/harness.mjs';
import { markdownTable } from '../lib/report.mjs';
import { maxOverMean, mean, percentile, round } from '../lib/stats.mjs';
import { multiturnConfig, runConversations } from './multiturn.mjs';

const MODES = ['off', 'prefer', 'strict'];

/** @param {Record<string, string | true>} options */
export async function runGroups(options) {
  const modes = listOption(options, 'policy', MODES);
  const quick = options.quick === true;
  // multiturn's workload, smaller by default: what matters here is where the legs go
  const cfg = multiturnConfig({
    conversations: quick ? '24' : '48',
    turns: '3',
    'first-turn-tokens': '2048',
    'turn-tokens': '512',
    'output-tokens': '64',
    concurrency: '16',
    'time-scale': quick ? '0.2' : '0.5',
    ...options,
    quick: undefined,
  });
  const preset = typeof options.preset === 'string' ? options.preset : 'seed000';
  const engine = engineOverrides(options);
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
      // the engines know their group too: their links cross the spine to the other group
      engines,
      defaults: { timeScale: cfg.timeScale, preset, ...engine },
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
      /** @type {{ cross: boolean, transferMs: number, msPerGB: number, firstTokenMs: number }[]} */
      const legs = [];
      for (const byEngine of Object.values(perRequest)) {
        for (const [engineId, rec] of Object.entries(byEngine)) {
          if (rec.leg !== 'vllmDecode' || rec.remoteEngineId === undefined) continue;
          legs.push({
            cross: groupOf[rec.remoteEngineId] !== groupOf[engineId],
            transferMs: rec.transferMs ?? NaN,
            // transfer time per GB moved: what the link gave this transfer, whatever its size
            msPerGB: rec.transferBytes > 0 ? rec.transferMs / (rec.transferBytes / 1e9) : NaN,
            firstTokenMs: rec.decodeFirstTokenMs ?? NaN,
          });
        }
      }
      const cross = legs.filter((l) => l.cross);
      const inGroup = legs.filter((l) => !l.cross);
      const p = (/** @type {typeof legs} */ list, /** @type {'transferMs' | 'msPerGB' | 'firstTokenMs'} */ k, /** @type {number} */ q) =>
        round(percentile(list.map((l) => l[k]).filter(Number.isFinite), q), 2);
      const ds = Object.values(stats).filter((e) => e.role === 'decode');
      const ps = Object.values(stats).filter((e) => e.role === 'prefill');
      const dCounts = ds.map((e) => e.requests.vllmDecode);
      const itl = ds.flatMap((e) => e.itlMs);
      const ttft = ds.flatMap((e) => e.ttftMs);
      results.push({
        policy: mode,
        crossGroupShare: round(cross.length / Math.max(1, legs.length), 3),
        crossGroupLegs: cross.length,
        decodeLegs: legs.length,
        transferInGroupP50Ms: p(inGroup, 'transferMs', 50),
        transferCrossGroupP50Ms: p(cross, 'transferMs', 50),
        transferMsPerGBInGroupP50: p(inGroup, 'msPerGB', 50),
        transferMsPerGBCrossGroupP50: p(cross, 'msPerGB', 50),
        decodeFirstTokenInGroupP50Ms: p(inGroup, 'firstTokenMs', 50),
        decodeFirstTokenCrossGroupP50Ms: p(cross, 'firstTokenMs', 50),
        decodeFirstTokenP50Ms: p(legs, 'firstTokenMs', 50),
        decodeFirstTokenP99Ms: p(legs, 'firstTokenMs', 99),
        meanTransferMs: round(mean(legs.map((l) => l.transferMs).filter(Number.isFinite)), 2),
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
        devProxyRetries: turns.reduce((a, t) => a + (t.retries ?? 0), 0),
        wallS: round(wallS, 1),
      });
      process.stderr.write(`groups ${mode}: ${round(wallS, 1)} s\n`);
    } finally {
      await stack.close();
    }
  }
  const report = { scenario: 'groups', config: { ...cfg, policies: undefined, modes, policy: 'affinity', preset, engine }, results };
  return {
    report,
    table: groupsTable(report),
    chart: {
      title: 'groups (seed 001): 2 x (2P+2D), affinity, by pdGroup mode (simulated H200 + 400G IB, spine at half rate)',
      series: results.map((r) => r.policy),
      figures: [
        { name: 'cross-group transfer share', values: results.map((r) => r.crossGroupShare) },
        { name: 'mean transfer (sim ms)', values: results.map((r) => r.meanTransferMs) },
        { name: 'D first token p50 (sim ms)', values: results.map((r) => r.decodeFirstTokenP50Ms) },
        { name: 'D requests max/mean', values: results.map((r) => r.dMaxOverMean) },
      ],
    },
  };
}

/**
 * The table a run prints, from its report alone (`npm run bench -- docs` rebuilds it from the JSON).
 * @param {{ results: Record<string, any>[] }} report
 */
export function groupsTable({ results }) {
  // no leg across groups (strict) has no p50: NaN in the run, null in its JSON; both print n/a
  const v = (/** @type {number | null} */ x) => (typeof x === 'number' && Number.isFinite(x) ? x : 'n/a');
  return markdownTable(
    [
      'pdGroup',
      'cross-group share',
      'cross-group legs',
      'transfer p50 ms: in group / across',
      'transfer ms a GB p50: in group / across',
      'D first token p50 ms: in group / across',
      'D first token p50 / p99 ms',
      'D max/mean',
      'D requests',
      'P requests',
      'P hit ratio',
      'TTFT p99 ms',
      'ITL p99 ms',
      'errors (retried)',
      'wall s',
    ],
    results.map((r) => [
      r.policy,
      r.crossGroupShare,
      `${r.crossGroupLegs}/${r.decodeLegs}`,
      `${v(r.transferInGroupP50Ms)} / ${v(r.transferCrossGroupP50Ms)}`,
      `${v(r.transferMsPerGBInGroupP50)} / ${v(r.transferMsPerGBCrossGroupP50)}`,
      `${v(r.decodeFirstTokenInGroupP50Ms)} / ${v(r.decodeFirstTokenCrossGroupP50Ms)}`,
      `${v(r.decodeFirstTokenP50Ms)} / ${v(r.decodeFirstTokenP99Ms)}`,
      r.dMaxOverMean,
      Object.values(r.dRequests).join('/'),
      Object.values(r.pRequests).join('/'),
      r.pHitRatio,
      r.ttftP99Ms,
      r.itlP99Ms,
      `${r.errors} (${r.devProxyRetries})`,
      r.wallS,
    ]),
  );
}
