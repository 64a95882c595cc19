// `overhead`: what the router adds. The client calls the same engines directly with the same two
// vllm legs (SPEC 4), and through the router, alternating in the same run; then the Worker's
// memory with many slow streams open at once.
import { readFileSync } from 'node:fs';
import { setMaxListeners } from 'node:events';
import http from 'node:http';
import { listOption, numberOption } from '../lib/args.mjs';
import { policyFor, processGroupMembers, rssKb, startStack } from '../lib/harness.mjs';
import { createAgent, postJson, postJsonRetrying, runPool } from '../lib/http-client.mjs';
import { markdownTable } from '../lib/report.mjs';
import { percentile, round } from '../lib/stats.mjs';

const ENGINES = [
  { id: 'p0', role: /** @type {const} */ ('prefill') },
  { id: 'p1', role: /** @type {const} */ ('prefill') },
  { id: 'd0', role: /** @type {const} */ ('decode') },
  { id: 'd1', role: /** @type {const} */ ('decode') },
];

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
  const dr = await postJson(`${d}/v1/chat/completions`, { ...body, kv_transfer_params: pr.json?.kv_transfer_params ?? null }, {
    agent,
    headers: { 'x-request-id': requestId },
    onFirstByte: () => (firstByteAt = performance.now()),
  });
  return { ...dr, ttfbMs: firstByteAt - started, totalMs: performance.now() - started };
}

/** @param {Record<string, string | true>} options */
export async function runOverhead(options) {
  const policies = listOption(options);
  const levels = String(options.levels ?? '1,16,64').split(',').map(Number);
  const perLevel = numberOption(options, 'requests-per-level', 0);
  const promptChars = numberOption(options, 'prompt-chars', 64);
  const outputTokens = numberOption(options, 'output-tokens', 8);
  const rounds = 4;
  const results = [];
  // --memory-only: just the streams and the Worker's memory
  for (const policy of options['memory-only'] ? [] : policies) {
    const stack = await startStack({
      engines: ENGINES,
      defaults: { timeScale: 0 },
      clusterDocument: (started) => ({ protocol: 'vllm', policy: policyFor(policy), nodes: [...started.values()].map((e) => ({ id: e.id, url: e.url, role: e.role })) }),
    });
    try {
      const url = (/** @type {string} */ id) => /** @type {any} */ (stack.cluster.engines.get(id)).url;
      const body = (/** @type {number} */ i) => ({
        model: 'sim-model',
        messages: [{ role: 'user', content: `request ${i} `.padEnd(promptChars, 'x') }],
        stream: true,
        stream_options: { include_usage: true },
        max_tokens: outputTokens,
      });
      const levelsOut = [];
      let seq = 0;
      for (const c of levels) {
        const n = perLevel || (c === 1 ? 200 : Math.min(1600, c * 40));
        const agent = createAgent(c * 2);
        /** @type {number[]} */ const direct = [];
        /** @type {number[]} */ const routed = [];
        let directMs = 0;
        let routedMs = 0;
        let errors = 0;
        let retries = 0;
        // warm both paths (connections, isolate, Durable Object)
        await runPool(Math.max(c, 8), c, async () => {
          const i = seq++;
          await directTwoLegs({ p: url(`p${i % 2}`), d: url(`d${i % 2}`), body: body(i), requestId: `warm-${i}`, agent });
          await postJsonRetrying(`${stack.router.url}/v1/chat/completions`, body(i), { agent, headers: { 'x-request-id': `warm-r-${i}` } });
        });
        for (let round = 0; round < rounds; round++) {
          const share = Math.ceil(n / rounds);
          let t = performance.now();
          await runPool(share, c, async () => {
            const i = seq++;
            const r = await directTwoLegs({ p: url(`p${i % 2}`), d: url(`d${(i >> 1) % 2}`), body: body(i), requestId: `direct-${i}`, agent });
            if (r.status === 200 && !r.error) direct.push(r.ttfbMs);
            else errors++;
          });
          directMs += performance.now() - t;
          t = performance.now();
          await runPool(share, c, async () => {
            const i = seq++;
            const r = await postJsonRetrying(`${stack.router.url}/v1/chat/completions`, body(i), { agent, headers: { 'x-request-id': `router-${i}` } });
            retries += r.retries ?? 0;
            if (r.status === 200 && !r.error) routed.push(r.ttfbMs);
            else errors++;
          });
          routedMs += performance.now() - t;
        }
        agent.destroy();
        const row = {
          concurrency: c,
          requests: direct.length + routed.length,
          directTtfbP50Ms: round(percentile(direct, 50), 2),
          directTtfbP99Ms: round(percentile(direct, 99), 2),
          routerTtfbP50Ms: round(percentile(routed, 50), 2),
          routerTtfbP99Ms: round(percentile(routed, 99), 2),
          addedTtfbP50Ms: round(percentile(routed, 50) - percentile(direct, 50), 2),
          addedTtfbP99Ms: round(percentile(routed, 99) - percentile(direct, 99), 2),
          directReqPerS: round(direct.length / (directMs / 1000), 1),
          routerReqPerS: round(routed.length / (routedMs / 1000), 1),
          errors,
          devProxyRetries: retries,
        };
        levelsOut.push(row);
        process.stderr.write(`overhead ${policy} c=${c}: added TTFB p50 ${row.addedTtfbP50Ms} ms, p99 ${row.addedTtfbP99Ms} ms\n`);
      }
      const at16 = levelsOut.find((l) => l.concurrency === 16);
      results.push({ policy, addedTtfbP50MsAt16: at16?.addedTtfbP50Ms, addedTtfbP99MsAt16: at16?.addedTtfbP99Ms, levels: levelsOut });
    } finally {
      await stack.close();
    }
  }

  const decision = options['no-decision'] || options['memory-only'] ? undefined : await measureDecisionCost({
    promptChars: numberOption(options, 'decision-prompt-chars', 120000),
    requests: numberOption(options, 'decision-requests', 200),
  });

  const memory = options['no-memory'] ? undefined : await measureStreamMemory({
    policy: policies[0],
    streams: numberOption(options, 'streams', 1000),
    streamSeconds: numberOption(options, 'stream-seconds', 120),
  });

  const rows = results.flatMap((r) => r.levels.map((l) => [r.policy, l.concurrency, l.directTtfbP50Ms, l.routerTtfbP50Ms, l.addedTtfbP50Ms, l.directTtfbP99Ms, l.routerTtfbP99Ms, l.addedTtfbP99Ms, l.directReqPerS, l.routerReqPerS, `${l.errors} (${l.devProxyRetries})`]));
  let table = markdownTable(['policy', 'conc.', 'direct p50 ms', 'router p50 ms', 'added p50 ms', 'direct p99 ms', 'router p99 ms', 'added p99 ms', 'direct req/s', 'router req/s', 'errors (retried)'], rows);
  const targets = results.map((r) => ({ policy: r.policy, p50: r.addedTtfbP50MsAt16, p99: r.addedTtfbP99MsAt16, met: (r.addedTtfbP50MsAt16 ?? Infinity) <= 1 && (r.addedTtfbP99MsAt16 ?? Infinity) <= 5 }));
  table += '\n\n' + markdownTable(['target at concurrency 16: added TTFB p50 <= 1 ms, p99 <= 5 ms', 'added p50 ms', 'added p99 ms', 'met'], targets.map((t) => [t.policy, t.p50, t.p99, t.met ? 'yes' : 'NO']));
  if (decision) {
    table += '\n\n' + markdownTable(
      [`decision cost, ${decision.promptChars}-character prompt, concurrency 1`, 'TTFB p50 ms', 'TTFB p90 ms', 'added by cache_aware p50 ms', 'target <= 1 ms'],
      decision.rows.map((r) => [r.policy, r.ttfbP50Ms, r.ttfbP90Ms, r.policy === 'cache_aware' ? decision.addedP50Ms : '', r.policy === 'cache_aware' ? (decision.addedP50Ms <= 1 ? 'yes' : 'NO') : '']),
    );
  }
  if (memory) {
    table += '\n\n' + markdownTable(
      ['streams open (of asked)', 'workerd RSS before KB (worker+proxy)', 'peak KB', 'growth KB', 'KB per stream (both / user Worker)', 'target < 50 KB', 'upstream legs still open after the clients left'],
      [[`${memory.streamsOpen} (${memory.streamsAsked})`, memory.rssBeforeKb, memory.rssPeakKb, memory.rssPeakKb - memory.rssBeforeKb, `${memory.kbPerStream} / ${memory.userWorkerKbPerStream}`, memory.kbPerStream < 50 ? 'yes' : 'NO', memory.upstreamInflightAfterAbort]],
    );
  }
  return {
    report: { scenario: 'overhead', config: { levels, promptChars, outputTokens, rounds }, results, decision, memory, targets },
    table,
    chart: {
      title: 'overhead: router added TTFB (ms) and throughput vs direct two legs',
      series: results.map((r) => r.policy),
      figures: levels.flatMap((c) => [
        { name: `added p50 ms @${c}`, values: results.map((r) => r.levels.find((l) => l.concurrency === c)?.addedTtfbP50Ms ?? NaN) },
        { name: `added p99 ms @${c}`, values: results.map((r) => r.levels.find((l) => l.concurrency === c)?.addedTtfbP99Ms ?? NaN) },
      ]).concat([{ name: 'router/direct req/s @16', values: results.map((r) => { const l = r.levels.find((x) => x.concurrency === 16); return l ? l.routerReqPerS / l.directReqPerS : NaN; }) }]),
    },
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
      engines: [{ id: 'c0', role: 'both', timeScale: 0 }, { id: 'c1', role: 'both', timeScale: 0 }],
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
        await postJsonRetrying(`${stack.router.url}/v1/completions`, { model: 'sim-model', prompt, max_tokens: 1 }, { agent, onFirstByte: () => (firstByteAt = performance.now()) });
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

/** `worker` for the workerd running the user Worker (it has the inspector), else `proxy`. @param {number} pid */
function workerdRole(pid) {
  try {
    // under wrangler dev the user Worker's workerd is the one with the inspector; Miniflare
    // (--runtime workerd) runs one workerd with no inspector and no dev proxy: the Worker's
    if (process.env.BENCH_RUNTIME !== 'wrangler') return 'worker';
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes('--inspector-addr') ? 'worker' : 'proxy';
  } catch {
    return 'unknown';
  }
}

/**
 * Open `streams` slow streams through the router and watch workerd's resident memory.
 * @param {{ policy: string, streams: number, streamSeconds: number }} o
 */
async function measureStreamMemory({ policy, streams, streamSeconds }) {
  const stepMs = 50;
  const stack = await startStack({
    engines: [
      { id: 'p0', role: 'prefill', timeScale: 0 },
      { id: 'd0', role: 'decode', timeScale: 1, decodeBaseMs: stepMs, decodeMsPerSeq: 0, transferInterferenceMs: 0, transferMsPerBlock: 0 },
    ],
    clusterDocument: (started) => ({ protocol: 'vllm', policy: policyFor(policy), nodes: [...started.values()].map((e) => ({ id: e.id, url: e.url, role: e.role })) }),
  });
  try {
    // wrangler dev runs two workerd processes: the dev proxy (listens on the public port) and
    // the user Worker (with the inspector); both are sampled, and reported apart
    const workerds = (await processGroupMembers(stack.router.pid)).filter((m) => m.comm === 'workerd').map((m) => ({ ...m, role: workerdRole(m.pid) }));
    const rss = async () => Promise.all(workerds.map((w) => rssKb(w.pid)));
    const body = (/** @type {number} */ i, /** @type {number} */ tokens) => ({ model: 'sim-model', messages: [{ role: 'user', content: `stream ${i}` }], stream: true, max_tokens: tokens });
    const agent = new http.Agent({ keepAlive: false, maxSockets: streams + 50 });
    // warm up with a few short streams, then let things settle
    await runPool(50, 10, (i) => postJsonRetrying(`${stack.router.url}/v1/chat/completions`, body(i, 4), { agent }));
    await new Promise((r) => setTimeout(r, 1500));
    const maxInto = (/** @type {number[]} */ into, /** @type {number[]} */ xs) => xs.forEach((x, i) => (into[i] = Math.max(into[i], Number.isFinite(x) ? x : 0)));
    const before = workerds.map(() => 0);
    for (let i = 0; i < 5; i++) {
      maxInto(before, await rss());
      await new Promise((r) => setTimeout(r, 200));
    }
    const controller = new AbortController();
    setMaxListeners(streams + 10, controller.signal);
    let open = 0;
    const peak = [...before];
    const sampler = setInterval(async () => maxInto(peak, await rss()), 100);
    const tokens = Math.ceil((streamSeconds * 1000) / stepMs);
    const pending = Array.from({ length: streams }, (_, i) =>
      postJson(`${stack.router.url}/v1/chat/completions`, body(i, tokens), { agent, signal: controller.signal, onFirstByte: () => open++, timeoutMs: (streamSeconds + 120) * 1000 }),
    );
    // wrangler dev admits new requests slowly on a busy machine: wait for all to be open
    const deadline = performance.now() + Math.min(90000, streamSeconds * 1000 * 0.75);
    while (open < streams && performance.now() < deadline) await new Promise((r) => setTimeout(r, 100));
    const streamsOpen = open;
    // keep sampling a little while they are all open
    await new Promise((r) => setTimeout(r, 2000));
    clearInterval(sampler);
    maxInto(peak, await rss());
    controller.abort();
    await Promise.allSettled(pending);
    // the router must abort the upstream legs when the client leaves
    let upstreamInflightAfterAbort = NaN;
    for (let i = 0; i < 50; i++) {
      await new Promise((r) => setTimeout(r, 200));
      const stats = await stack.stats();
      upstreamInflightAfterAbort = Object.values(stats).reduce((a, e) => a + e.inflight, 0);
      if (upstreamInflightAfterAbort === 0) break;
    }
    agent.destroy();
    const sum = (/** @type {number[]} */ xs) => xs.reduce((a, b) => a + b, 0);
    const user = workerds.findIndex((w) => w.role === 'worker');
    return {
      streamsAsked: streams,
      streamsOpen,
      streamSeconds,
      rssBeforeKb: sum(before),
      rssPeakKb: sum(peak),
      // per request in flight through the router (all of them hold memory, open to the client or not)
      kbPerStream: round((sum(peak) - sum(before)) / streams, 1),
      userWorkerKbPerStream: user >= 0 ? round((peak[user] - before[user]) / streams, 1) : NaN,
      processes: workerds.map((w, i) => ({ pid: w.pid, role: w.role, rssBeforeKb: before[i], rssPeakKb: peak[i] })),
      upstreamInflightAfterAbort,
    };
  } finally {
    await stack.close();
  }
}
