// `overhead`: what the router adds (issue 12). In the same run and alternating round by round:
// the client calls the engines directly with the same two vllm legs (SPEC 4), through a minimal
// pass-through Worker (bench/baseline-worker: two plain fetch legs, no state), and through the
// router, each Worker in its own workerd (through Miniflare) so its CPU time is its own. Then
// cache_aware's decision cost on a long prompt, and memory per open stream and how soon the
// upstream legs close after the clients leave, for the baseline and each policy.
import { appendFileSync, mkdtempSync, rmSync } from 'node:fs';
import { setMaxListeners } from 'node:events';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { ALL_POLICIES, listOption, numberOption } from '../lib/args.mjs';
import { countKinds, failureKind } from '../lib/failures.mjs';
import { onShutdown, policyFor, startSimCluster, startStack, workerSnapshot } from '../lib/harness.mjs';
import { createAgent, postJson, postJsonRetrying, runPool } from '../lib/http-client.mjs';
import { cpuMeter, groupRssKb } from '../lib/proc.mjs';
import { formatNumber, markdownTable } from '../lib/report.mjs';
import { drainTimes, percentile, ratio, round } from '../lib/stats.mjs';
import { startWorkerd } from '../lib/workerd.mjs';

/** `--nodes N`: N/2 prefill and N/2 decode engines (default 4: 2P+2D). @param {number} n */
export function enginesOf(n) {
  const half = Math.max(1, Math.floor(n / 2));
  return [
    ...Array.from({ length: half }, (_, i) => ({ id: `p${i}`, role: /** @type {const} */ ('prefill') })),
    ...Array.from({ length: half }, (_, i) => ({ id: `d${i}`, role: /** @type {const} */ ('decode') })),
  ];
}

const DISAGGREGATIONS = ['always', 'conditional', 'predicted'];

/**
 * A router target of `--policy`: a policy, or `policy/disaggregation` (e.g. `cache_aware/predicted`,
 * to set the decision's cost beside `cache_aware/conditional` in one run).
 * @param {string} target
 */
export function targetPolicy(target) {
  const [policy, disaggregation] = target.split('/');
  if (!ALL_POLICIES.includes(/** @type {string} */ (policy))) throw new Error(`--policy: unknown ${policy} (one of ${ALL_POLICIES.join(', ')})`);
  if (disaggregation !== undefined && !DISAGGREGATIONS.includes(disaggregation))
    throw new Error(`--policy: unknown disaggregation ${disaggregation} in ${target} (one of ${DISAGGREGATIONS.join(', ')})`);
  return policyFor(/** @type {string} */ (policy), disaggregation ? { disaggregation } : {});
}

/**
 * The prefill leg's body, by the field rules of SPEC 4 (vllm).
 * @param {Record<string, any>} body
 */
export function vllmPrefillBody(body) {
  const p = { ...body, stream: false, max_tokens: 1 };
  if ('max_completion_tokens' in body) p.max_completion_tokens = 1;
  delete p.stream_options;
  delete p.min_tokens;
  delete p.min_completion_tokens;
  p.kv_transfer_params = { do_remote_decode: true, do_remote_prefill: false, remote_engine_id: null, remote_block_ids: null, remote_host: null, remote_port: null };
  return p;
}

/**
 * What a client without the router does: P with the prefill body, then D with P's
 * kv_transfer_params, streamed. TTFB is measured from the start to D's first body byte.
 * @param {{ p: string, d: string, body: Record<string, any>, requestId: string, agent: http.Agent }} leg
 */
export async function directTwoLegs({ p, d, body, requestId, agent }) {
  const started = performance.now();
  const pr = await postJson(`${p}/v1/chat/completions`, vllmPrefillBody(body), { agent, headers: { 'x-request-id': requestId } });
  if (pr.status !== 200) return { ...pr, ttfbMs: NaN };
  let firstByteAt = NaN;
  const dr = await postJson(
    `${d}/v1/chat/completions`,
    { ...body, kv_transfer_params: pr.json?.kv_transfer_params ?? null },
    {
      agent,
      headers: { 'x-request-id': requestId },
      onFirstByte: () => (firstByteAt = performance.now()),
    },
  );
  return { ...dr, ttfbMs: firstByteAt - started, totalMs: performance.now() - started };
}

const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const BASELINE_ENTRY = path.join(REPO_ROOT, 'bench', 'baseline-worker', 'index.js');

/**
 * @typedef {{ url: string, pid: number, stop: () => Promise<void> }} Proxy
 * @typedef {'baseline' | string} Target `baseline` (bench/baseline-worker) or a router policy
 */

/**
 * The pass-through baseline Worker, or the router with one policy, in workerd through Miniflare
 * (the same launcher for both, so both are measured alike).
 * @param {Target} target
 * @param {Map<string, { id: string, url: string, role: string }>} engines
 * @param {Record<string, string>} [vars] router only
 * @returns {Promise<Proxy>}
 */
export async function startProxy(target, engines, vars = {}) {
  const persistDir = mkdtempSync(path.join(os.tmpdir(), 'pd-bench-proxy-'));
  const list = [...engines.values()];
  const urls = (/** @type {string} */ role) =>
    list
      .filter((e) => e.role === role)
      .map((e) => e.url)
      .join(',');
  const common = { cwd: workerSnapshot(), persistDir, onOutput: routerLog() };
  /** @type {Awaited<ReturnType<typeof startWorkerd>>} */
  let proc;
  try {
    proc =
      target === 'baseline'
        ? await startWorkerd({ ...common, entry: BASELINE_ENTRY, bare: true, vars: { P_URLS: urls('prefill'), D_URLS: urls('decode') } })
        : await startWorkerd({
            ...common,
            vars,
            clusterDocument: { protocol: 'vllm', policy: targetPolicy(target), nodes: list.map((e) => ({ id: e.id, url: e.url, role: e.role })) },
          });
  } catch (error) {
    rmSync(persistDir, { recursive: true, force: true });
    throw error;
  }
  const stop = async () => {
    unregister();
    await proc.stop();
    rmSync(persistDir, { recursive: true, force: true });
  };
  const unregister = onShutdown(stop);
  return { url: proc.url, pid: proc.pid, stop };
}

/** BENCH_ROUTER_LOG=FILE appends the Workers' output there. */
function routerLog() {
  const file = process.env.BENCH_ROUTER_LOG;
  return file ? (/** @type {string} */ line) => appendFileSync(file, line + '\n') : undefined;
}

/**
 * Samples of one path (direct, baseline or router) at one concurrency, over all rounds.
 * @typedef {{ ttfb: number[], kinds: (string | null)[], ms: number, cpuMs: number, sent: number, clientAborted: number }} PathSamples
 */
const newSamples = () => /** @type {PathSamples} */ ({ ttfb: [], kinds: [], ms: 0, cpuMs: 0, sent: 0, clientAborted: 0 });

/**
 * Figures of one path against direct calls measured in the same rounds.
 * @param {PathSamples} s @param {PathSamples | null} direct null for direct itself
 */
export function pathFigures(s, direct) {
  const ok = s.ttfb;
  const failures = countKinds(s.kinds);
  const p50 = percentile(ok, 50);
  const p99 = percentile(ok, 99);
  return {
    requests: s.sent,
    ttfbP50Ms: round(p50, 2),
    ttfbP99Ms: round(p99, 2),
    ...(direct ? { addedTtfbP50Ms: round(p50 - percentile(direct.ttfb, 50), 2), addedTtfbP99Ms: round(p99 - percentile(direct.ttfb, 99), 2) } : {}),
    reqPerS: round(ok.length / (s.ms / 1000), 1),
    ...(direct ? { cpuMsPerRequest: round(s.cpuMs / Math.max(1, s.sent), 3) } : {}),
    failed: failures.reduce((a, f) => a + f.count, 0),
    failures,
    ...(s.clientAborted ? { clientAborted: s.clientAborted } : {}),
  };
}

/**
 * The router against the baseline Worker and direct calls: the ratios issue 12 sets targets on.
 * @param {ReturnType<typeof pathFigures>} router @param {ReturnType<typeof pathFigures>} baseline @param {ReturnType<typeof pathFigures>} direct
 */
export function levelRatios(router, baseline, direct) {
  return {
    addedTtfbP50VsBaseline: ratio(/** @type {number} */ (router.addedTtfbP50Ms), /** @type {number} */ (baseline.addedTtfbP50Ms)),
    addedTtfbP99VsBaseline: ratio(/** @type {number} */ (router.addedTtfbP99Ms), /** @type {number} */ (baseline.addedTtfbP99Ms)),
    ttfbP50VsBaseline: ratio(router.ttfbP50Ms, baseline.ttfbP50Ms),
    ttfbP50VsDirect: ratio(router.ttfbP50Ms, direct.ttfbP50Ms),
    ttfbP99VsDirect: ratio(router.ttfbP99Ms, direct.ttfbP99Ms),
    reqPerSVsBaseline: ratio(router.reqPerS, baseline.reqPerS),
    reqPerSVsDirect: ratio(router.reqPerS, direct.reqPerS),
    cpuVsBaseline: ratio(/** @type {number} */ (router.cpuMsPerRequest), /** @type {number} */ (baseline.cpuMsPerRequest)),
  };
}

/** @param {Record<string, string | true>} options */
export async function runOverhead(options) {
  // each a policy or policy/disaggregation (targetPolicy)
  const targets = ALL_POLICIES.flatMap((p) => [p, ...DISAGGREGATIONS.map((d) => `${p}/${d}`)]);
  const policies = listOption(options, 'policy', targets, ALL_POLICIES);
  const engines = enginesOf(numberOption(options, 'nodes', 4));
  const levels = String(options.levels ?? '1,16,64')
    .split(',')
    .map(Number);
  const perLevel = numberOption(options, 'requests-per-level', 0);
  const promptChars = numberOption(options, 'prompt-chars', 64);
  const outputTokens = numberOption(options, 'output-tokens', 8);
  const rounds = numberOption(options, 'rounds', 3);
  const abortShare = numberOption(options, 'abort-share', 0);
  // --router-vars CONFIG_TTL_MS=600000,...: Worker vars for the router (experiments)
  const routerVars = Object.fromEntries(
    String(options['router-vars'] ?? '')
      .split(',')
      .filter(Boolean)
      .map((kv) => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)]),
  );
  /** @type {any[]} */
  const results = [];
  /** @type {Map<number, { direct: PathSamples, baseline: PathSamples }>} pooled over the policies' runs */
  const pooled = new Map();
  const body = (/** @type {number} */ i) => ({
    model: 'sim-model',
    messages: [{ role: 'user', content: `request ${i} `.padEnd(promptChars, 'x') }],
    stream: true,
    // --no-usage: streams without a usage frame (the OpenAI SDK's default): what the router's
    // reader costs on the lines it must look through for one an engine might send unasked
    ...(options['no-usage'] ? {} : { stream_options: { include_usage: true } }),
    max_tokens: outputTokens,
  });

  if (!options['memory-only']) {
    const cluster = await startSimCluster({ engines, defaults: { timeScale: 0 } });
    const unregister = onShutdown(() => cluster.close());
    const baseline = await startProxy('baseline', cluster.engines);
    try {
      const url = (/** @type {string} */ id) => /** @type {any} */ (cluster.engines.get(id)).url;
      for (const policy of policies) {
        const router = await startProxy(policy, cluster.engines, routerVars);
        try {
          const levelsOut = [];
          let seq = 0;
          for (const c of levels) {
            const n = perLevel || (c === 1 ? 200 : Math.min(1600, c * 40));
            const agent = createAgent(c * 3);
            // --abort-share X: that share of the requests through a proxy is abandoned by its
            // client 0-2 ms after it was sent (users stop generations); not counted as failures,
            // but whatever it does to the requests around it is
            const abortEvery = abortShare > 0 ? Math.max(1, Math.round(1 / abortShare)) : 0;
            const viaProxy = async (/** @type {string} */ base, /** @type {string} */ name, /** @type {number} */ i) => {
              const abandon = abortEvery > 0 && i % abortEvery === 0;
              const abandonAfterSentMs = abandon ? Math.floor(Math.random() * 3) : undefined;
              const res = await postJson(`${base}/v1/chat/completions`, body(i), { agent, abandonAfterSentMs, headers: { 'x-request-id': `${name}-${i}` } });
              return abandon ? { ...res, clientAborted: true } : res;
            };
            /** @type {{ name: 'direct' | 'baseline' | 'router', pgid: number | null, send: (i: number) => Promise<import('../lib/http-client.mjs').PostResult> }[]} */
            const paths = [
              { name: 'direct', pgid: null, send: (i) => directTwoLegs({ p: url(`p${i % 2}`), d: url(`d${(i >> 1) % 2}`), body: body(i), requestId: `direct-${i}`, agent }) },
              { name: 'baseline', pgid: baseline.pid, send: (i) => viaProxy(baseline.url, 'baseline', i) },
              { name: 'router', pgid: router.pid, send: (i) => viaProxy(router.url, 'router', i) },
            ];
            // warm every path (connections, isolates, JIT, the Durable Object)
            for (const p of paths) await runPool(Math.max(2 * c, 50), c, () => p.send(seq++));
            const samples = { direct: newSamples(), baseline: newSamples(), router: newSamples() };
            for (let r = 0; r < rounds; r++) {
              for (const p of paths) {
                const s = samples[p.name];
                const share = Math.ceil(n / rounds);
                const cpu = p.pgid === null ? null : cpuMeter(p.pgid);
                const t = performance.now();
                await runPool(share, c, async () => {
                  const res = /** @type {import('../lib/http-client.mjs').PostResult & { clientAborted?: boolean }} */ (await p.send(seq++));
                  if (res.clientAborted) return void s.clientAborted++;
                  const kind = failureKind(res);
                  s.kinds.push(kind);
                  if (kind === null) s.ttfb.push(res.ttfbMs);
                });
                s.ms += performance.now() - t;
                s.cpuMs += cpu ? cpu.stop() : 0;
                s.sent += share;
              }
            }
            agent.destroy();
            const pool = pooled.get(c) ?? { direct: newSamples(), baseline: newSamples() };
            pooled.set(c, pool);
            for (const k of /** @type {const} */ (['direct', 'baseline'])) {
              pool[k].ttfb.push(...samples[k].ttfb);
              pool[k].kinds.push(...samples[k].kinds);
              pool[k].ms += samples[k].ms;
              pool[k].cpuMs += samples[k].cpuMs;
              pool[k].sent += samples[k].sent;
              pool[k].clientAborted += samples[k].clientAborted;
            }
            const direct = pathFigures(samples.direct, null);
            const base = pathFigures(samples.baseline, samples.direct);
            const routed = pathFigures(samples.router, samples.direct);
            const row = { concurrency: c, direct, baseline: base, router: routed, ratios: levelRatios(routed, base, direct) };
            levelsOut.push(row);
            process.stderr.write(
              `overhead ${policy} c=${c}: added TTFB p50 ${routed.addedTtfbP50Ms} ms (baseline ${base.addedTtfbP50Ms}), p99 ${routed.addedTtfbP99Ms} (baseline ${base.addedTtfbP99Ms}); CPU ${routed.cpuMsPerRequest} ms/req (baseline ${base.cpuMsPerRequest}); req/s ${routed.reqPerS} (baseline ${base.reqPerS}, direct ${direct.reqPerS}); failed ${routed.failed}${routed.failures.length ? ` ${JSON.stringify(routed.failures)}` : ''}\n`,
            );
          }
          results.push({ policy, ...headline(levelsOut), levels: levelsOut });
        } finally {
          await router.stop();
        }
      }
    } finally {
      await baseline.stop();
      unregister();
      await cluster.close();
    }
  }

  const decision =
    options['no-decision'] || options['memory-only']
      ? undefined
      : await measureDecisionCost({
          promptChars: numberOption(options, 'decision-prompt-chars', 120000),
          requests: numberOption(options, 'decision-requests', 200),
        });

  // memory per open stream and upstream close after the clients left: the baseline and each policy
  const memoryTargets = options['no-memory'] ? [] : ['baseline', ...listOption(options, 'memory-policy', undefined, policies)];
  const memory = memoryTargets.length
    ? await measureStreamMemory({ targets: memoryTargets, streams: numberOption(options, 'streams', 1000), streamSeconds: numberOption(options, 'stream-seconds', 120) })
    : [];
  const baseMemory = memory.find((m) => m.target === 'baseline');
  for (const m of memory) {
    if (baseMemory && m.target !== 'baseline') m.kbPerStreamVsBaseline = ratio(m.kbPerStream, baseMemory.kbPerStream);
    const r = results.find((x) => x.policy === m.target);
    if (r)
      Object.assign(r, {
        memoryKbPerStream: m.kbPerStream,
        memoryVsBaseline: m.kbPerStreamVsBaseline,
        upstreamClosedAllMs: m.upstreamClosedAllMs,
        upstreamClosedHalfMs: m.upstreamClosedHalfMs,
      });
  }
  const baselineLevels = [...pooled].map(([c, s]) => {
    const direct = pathFigures(s.direct, null);
    return { concurrency: c, direct, baseline: pathFigures(s.baseline, s.direct) };
  });

  const report = {
    scenario: 'overhead',
    config: { levels, promptChars, outputTokens, usage: !options['no-usage'], rounds, requestsPerLevel: perLevel || 'default', routerVars, abortShare },
    baseline: { levels: baselineLevels, memory: baseMemory },
    results,
    decision,
    memory,
  };
  return { report, table: overheadTables(report), chart: overheadChart(report, levels) };
}

/**
 * The per-policy figures docs/benchmark.md and benchmark-results.md quote: at concurrency 16 and 64, with ratios.
 * @param {any[]} levelsOut
 */
export function headline(levelsOut) {
  /** @type {Record<string, number>} */
  const out = {};
  for (const l of levelsOut) {
    const c = l.concurrency;
    out[`addedTtfbP50MsAt${c}`] = l.router.addedTtfbP50Ms;
    out[`addedTtfbP99MsAt${c}`] = l.router.addedTtfbP99Ms;
    out[`reqPerSAt${c}`] = l.router.reqPerS;
    out[`cpuMsPerRequestAt${c}`] = l.router.cpuMsPerRequest;
    out[`cpuVsBaselineAt${c}`] = l.ratios.cpuVsBaseline;
    out[`addedTtfbP50VsBaselineAt${c}`] = l.ratios.addedTtfbP50VsBaseline;
    out[`failedAt${c}`] = l.router.failed;
  }
  return out;
}

/** @param {any} report */
export function overheadTables(report) {
  const sections = [];
  const x = (/** @type {number} */ v) => (Number.isFinite(v) ? `${formatNumber(v)}x` : 'n/a');
  if (report.results.length) {
    sections.push(
      markdownTable(
        [
          'policy',
          'conc.',
          'added TTFB p50 ms: baseline / router (x)',
          'added TTFB p99 ms: baseline / router (x)',
          'req/s: direct / baseline / router',
          'router req/s vs baseline / direct',
          'CPU ms/req: baseline / router (x)',
          'failed: baseline / router (of each)',
        ],
        report.results.flatMap((/** @type {any} */ r) =>
          r.levels.map((/** @type {any} */ l) => [
            r.policy,
            l.concurrency,
            `${formatNumber(l.baseline.addedTtfbP50Ms)} / ${formatNumber(l.router.addedTtfbP50Ms)} (${x(l.ratios.addedTtfbP50VsBaseline)})`,
            `${formatNumber(l.baseline.addedTtfbP99Ms)} / ${formatNumber(l.router.addedTtfbP99Ms)} (${x(l.ratios.addedTtfbP99VsBaseline)})`,
            `${formatNumber(l.direct.reqPerS)} / ${formatNumber(l.baseline.reqPerS)} / ${formatNumber(l.router.reqPerS)}`,
            `${x(l.ratios.reqPerSVsBaseline)} / ${x(l.ratios.reqPerSVsDirect)}`,
            `${formatNumber(l.baseline.cpuMsPerRequest)} / ${formatNumber(l.router.cpuMsPerRequest)} (${x(l.ratios.cpuVsBaseline)})`,
            `${l.baseline.failed} / ${l.router.failed} (${l.router.requests})`,
          ]),
        ),
      ),
    );
    sections.push(
      markdownTable(
        ['TTFB ms (p50 / p99)', 'conc.', 'direct', 'baseline Worker', 'router', 'router vs direct p50 / p99'],
        report.results.flatMap((/** @type {any} */ r) =>
          r.levels.map((/** @type {any} */ l) => [
            r.policy,
            l.concurrency,
            `${formatNumber(l.direct.ttfbP50Ms)} / ${formatNumber(l.direct.ttfbP99Ms)}`,
            `${formatNumber(l.baseline.ttfbP50Ms)} / ${formatNumber(l.baseline.ttfbP99Ms)}`,
            `${formatNumber(l.router.ttfbP50Ms)} / ${formatNumber(l.router.ttfbP99Ms)}`,
            `${x(l.ratios.ttfbP50VsDirect)} / ${x(l.ratios.ttfbP99VsDirect)}`,
          ]),
        ),
      ),
    );
    const failures = report.results.flatMap((/** @type {any} */ r) =>
      r.levels.flatMap((/** @type {any} */ l) =>
        [
          ['baseline', l.baseline],
          ['router', l.router],
          ['direct', l.direct],
        ].flatMap(([who, f]) => f.failures.map((/** @type {any} */ k) => [r.policy, l.concurrency, who, k.kind, k.count])),
      ),
    );
    sections.push(
      failures.length
        ? markdownTable(['failed requests by kind: policy', 'conc.', 'path', 'kind (status and error)', 'count'], failures)
        : 'failed requests: none (no non-2xx answer, no broken stream, on any path)',
    );
  }
  if (report.decision) {
    const d = report.decision;
    sections.push(
      markdownTable(
        [
          `decision cost, ${d.promptChars}-character prompt (~${Math.round(d.promptChars / 4)} tokens), concurrency 1`,
          'TTFB p50 ms',
          'TTFB p90 ms',
          'added by cache_aware p50 ms',
          'target <= 0.5 ms',
        ],
        d.rows.map((/** @type {any} */ r) => [
          r.policy,
          r.ttfbP50Ms,
          r.ttfbP90Ms,
          r.policy === 'cache_aware' ? d.addedP50Ms : '',
          r.policy === 'cache_aware' ? (d.addedP50Ms <= 0.5 ? 'yes' : 'NO') : '',
        ]),
      ),
    );
  }
  if (report.memory.length) {
    sections.push(
      markdownTable(
        [
          'memory, 1 slow stream each: target',
          'streams open (asked)',
          'workerd RSS before KB',
          'peak KB',
          'KB per stream (x baseline)',
          'upstream legs closed after the clients left: half / all ms',
          'legs still open at the end',
        ],
        report.memory.map((/** @type {any} */ m) => [
          m.target,
          `${m.streamsOpen} (${m.streamsAsked})`,
          m.rssBeforeKb,
          m.rssPeakKb,
          m.target === 'baseline' ? formatNumber(m.kbPerStream) : `${formatNumber(m.kbPerStream)} (${x(m.kbPerStreamVsBaseline)})`,
          `${formatNumber(m.upstreamClosedHalfMs)} / ${formatNumber(m.upstreamClosedAllMs)}`,
          m.upstreamStillOpen,
        ]),
      ),
    );
  }
  return sections.join('\n\n');
}

/** @param {any} report @param {number[]} levels */
function overheadChart(report, levels) {
  const rs = report.results;
  const at = (/** @type {any} */ r, /** @type {number} */ c) => r.levels.find((/** @type {any} */ l) => l.concurrency === c);
  const baseAt = (/** @type {number} */ c) => report.baseline.levels.find((/** @type {any} */ l) => l.concurrency === c)?.baseline;
  return {
    title: 'overhead: added TTFB (ms) and CPU per request, baseline Worker vs router',
    series: ['baseline', ...rs.map((/** @type {any} */ r) => r.policy)],
    figures: levels
      .filter((c) => c > 1)
      .flatMap((c) => [
        { name: `added p50 ms @${c}`, values: [baseAt(c)?.addedTtfbP50Ms ?? NaN, ...rs.map((/** @type {any} */ r) => at(r, c)?.router.addedTtfbP50Ms ?? NaN)] },
        { name: `added p99 ms @${c}`, values: [baseAt(c)?.addedTtfbP99Ms ?? NaN, ...rs.map((/** @type {any} */ r) => at(r, c)?.router.addedTtfbP99Ms ?? NaN)] },
        { name: `CPU ms/req @${c}`, values: [baseAt(c)?.cpuMsPerRequest ?? NaN, ...rs.map((/** @type {any} */ r) => at(r, c)?.router.cpuMsPerRequest ?? NaN)] },
      ])
      .concat([
        {
          name: 'KB per stream',
          values: ['baseline', ...rs.map((/** @type {any} */ r) => r.policy)].map((t) => report.memory.find((/** @type {any} */ m) => m.target === t)?.kbPerStream ?? NaN),
        },
      ]),
  };
}

/**
 * What cache_aware's pick costs: chained SHA-256 of every prefix block in the Worker plus the
 * index lookup in the Durable Object. Same long prompts, one at a time, to two colocated nodes
 * under round_robin and under cache_aware; the difference of TTFB p50 is the decision's cost.
 * @param {{ promptChars: number, requests: number }} o
 */
async function measureDecisionCost({ promptChars, requests }) {
  const rows = [];
  for (const policy of ['round_robin', 'cache_aware']) {
    const stack = await startStack({
      engines: [
        { id: 'c0', role: 'both', timeScale: 0 },
        { id: 'c1', role: 'both', timeScale: 0 },
      ],
      clusterDocument: (engines) => ({ protocol: 'colocated', policy: policyFor(policy), nodes: [...engines.values()].map((e) => ({ id: e.id, url: e.url, role: e.role })) }),
    });
    try {
      const agent = createAgent(4);
      /** @type {number[]} */
      const ttfb = [];
      const warmup = 20;
      for (let i = 0; i < requests + warmup; i++) {
        const prompt = `conversation ${i} `.padEnd(promptChars, 'lorem ipsum dolor sit amet ');
        let firstByteAt = NaN;
        const started = performance.now();
        await postJsonRetrying(
          `${stack.router.url}/v1/completions`,
          { model: 'sim-model', prompt, max_tokens: 1 },
          { agent, onFirstByte: () => (firstByteAt = performance.now()) },
        );
        if (i >= warmup) ttfb.push(firstByteAt - started);
      }
      rows.push({ policy, ttfbP50Ms: round(percentile(ttfb, 50), 2), ttfbP90Ms: round(percentile(ttfb, 90), 2) });
    } finally {
      await stack.close();
    }
  }
  const addedP50Ms = round(rows[1].ttfbP50Ms - rows[0].ttfbP50Ms, 2);
  process.stderr.write(`overhead decision cost: cache_aware adds ${addedP50Ms} ms p50 for a ${promptChars}-character prompt\n`);
  return { promptChars, requests, rows, addedP50Ms };
}

/**
 * Open `streams` slow streams through each target in turn (the baseline Worker, then the router
 * per policy) and watch workerd's resident memory; then abort every client at once and time how
 * long the engines keep upstream legs open.
 * @param {{ targets: Target[], streams: number, streamSeconds: number }} o
 */
async function measureStreamMemory({ targets, streams, streamSeconds }) {
  const stepMs = 50;
  const cluster = await startSimCluster({
    engines: [
      { id: 'p0', role: 'prefill', timeScale: 0 },
      { id: 'd0', role: 'decode', timeScale: 1, decodeBaseMs: stepMs, decodeMsPerSeq: 0, transferInterferenceMs: 0, transferMsPerBlock: 0 },
    ],
  });
  const unregister = onShutdown(() => cluster.close());
  const out = [];
  try {
    for (const target of targets) {
      const proxy = await startProxy(target, cluster.engines);
      try {
        out.push({ target, ...(await streamsThrough(proxy, cluster, { streams, streamSeconds, stepMs })) });
        process.stderr.write(`overhead memory ${target}: ${out.at(-1)?.kbPerStream} KB a stream, upstream closed ${out.at(-1)?.upstreamClosedAllMs} ms after the clients left\n`);
      } finally {
        await proxy.stop();
      }
    }
  } finally {
    unregister();
    await cluster.close();
  }
  return out;
}

/**
 * @param {Proxy} proxy
 * @param {Awaited<ReturnType<typeof startSimCluster>>} cluster
 * @param {{ streams: number, streamSeconds: number, stepMs: number }} o
 */
async function streamsThrough(proxy, cluster, { streams, streamSeconds, stepMs }) {
  const inflight = async () => Object.values(/** @type {Record<string, any>} */ (await (await fetch(cluster.controlUrl + '/stats')).json())).reduce((a, e) => a + e.inflight, 0);
  const body = (/** @type {number} */ i, /** @type {number} */ tokens) => ({
    model: 'sim-model',
    messages: [{ role: 'user', content: `stream ${i}` }],
    stream: true,
    max_tokens: tokens,
  });
  const agent = new http.Agent({ keepAlive: false, maxSockets: streams + 50 });
  const sleep = (/** @type {number} */ ms) => new Promise((r) => setTimeout(r, ms));
  // warm up with a few short streams, then let things settle
  await runPool(50, 10, (i) => postJson(`${proxy.url}/v1/chat/completions`, body(i, 4), { agent }));
  await sleep(1500);
  let before = 0;
  for (let i = 0; i < 5; i++) {
    before = Math.max(before, groupRssKb(proxy.pid));
    await sleep(200);
  }
  const controller = new AbortController();
  setMaxListeners(streams + 10, controller.signal);
  let open = 0;
  let peak = before;
  const sampler = setInterval(() => (peak = Math.max(peak, groupRssKb(proxy.pid))), 100);
  const tokens = Math.ceil((streamSeconds * 1000) / stepMs);
  const pending = Array.from({ length: streams }, (_, i) =>
    postJson(`${proxy.url}/v1/chat/completions`, body(i, tokens), { agent, signal: controller.signal, onFirstByte: () => open++, timeoutMs: (streamSeconds + 120) * 1000 }),
  );
  const deadline = performance.now() + Math.min(90000, streamSeconds * 1000 * 0.75);
  while (open < streams && performance.now() < deadline) await sleep(100);
  const streamsOpen = open;
  // keep sampling a little while they are all open
  await sleep(2000);
  clearInterval(sampler);
  peak = Math.max(peak, groupRssKb(proxy.pid));
  // every client leaves at once; the engines say when they saw their legs closed
  const leftAt = performance.now();
  controller.abort();
  /** @type {{ atMs: number, value: number }[]} */
  const samples = [{ atMs: leftAt, value: await inflight() }];
  while (performance.now() - leftAt < 15000) {
    await sleep(20);
    const value = await inflight();
    samples.push({ atMs: performance.now(), value });
    if (value === 0) break;
  }
  await Promise.allSettled(pending);
  agent.destroy();
  const closed = drainTimes(samples, leftAt);
  return {
    streamsAsked: streams,
    streamsOpen,
    streamSeconds,
    rssBeforeKb: before,
    rssPeakKb: peak,
    // per request in flight through the proxy (all of them hold memory, open to the client or not)
    kbPerStream: round((peak - before) / streams, 1),
    /** @type {number | undefined} */
    kbPerStreamVsBaseline: undefined,
    upstreamOpenWhenClientsLeft: samples[0].value,
    upstreamClosedHalfMs: closed.halfMs,
    upstreamClosedAllMs: closed.allMs,
    upstreamStillOpen: samples.at(-1)?.value ?? NaN,
  };
}
