// `abandoned`: prefill blocks held by requests whose client left after P answered, before a D
// admitted the request — today vs now, in the same run, on the same simulated engines.
//   today: what the router did before issue 10 — P's answer read, the handle dropped, no D ever
//          told: P (vLLM + NixlConnector) holds the blocks until VLLM_NIXL_ABORT_REQUEST_TIMEOUT
//          (480 s; current vLLM main: a 30 s lease). Played by a client that calls P directly
//          with the router's prefill body and never calls D.
//   now:   the router, with clients that leave while D has not admitted their request yet (both
//          D hold every connection --d-delay-ms without reading it: a D whose HTTP layer is
//          backed up): the router releases each handle no D read through D's rejection path
//          (docs/engines.md, section 1). On the edge the client's disconnect ends the request at
//          once; workerd run locally signals no disconnect before the response starts, so here
//          the router learns at decodeFirstByteMs (--first-byte-ms) that D did not answer,
//          releases, retries once on the other D (a fresh handle, released the same way) and
//          ends. The figure is therefore an upper bound of what the edge holds.
// Sampled every --sample-ms: P's held blocks (GET /stats heldBlocks) of both prefill engines.
//
// `npm run bench -- abandoned [--requests 20] [--prompt-tokens 8192] [--tail-ms 5000]
//   [--hold-ms 480000] [--json bench/results/abandoned.json]`.
import { numberOption } from '../lib/args.mjs';
import { startStack } from '../lib/harness.mjs';
import { markdownTable } from '../lib/report.mjs';
import { seededText } from '../lib/text.mjs';

const sleep = (/** @type {number} */ ms) => new Promise((r) => setTimeout(r, ms));

/** @param {Record<string, string | true>} options */
export async function runAbandoned(options) {
  const requests = numberOption(options, 'requests', 20);
  const promptTokens = numberOption(options, 'prompt-tokens', 8192);
  const tailMs = numberOption(options, 'tail-ms', 5000);
  const sampleMs = numberOption(options, 'sample-ms', 100);
  const holdMs = numberOption(options, 'hold-ms', 480000);
  const dDelayMs = numberOption(options, 'd-delay-ms', 3000);
  const firstByteMs = numberOption(options, 'first-byte-ms', 1000);
  const stack = await startStack({
    engines: [
      { id: 'p-today', role: 'prefill' },
      { id: 'p-now', role: 'prefill' },
      { id: 'd0', role: 'decode' },
      { id: 'd1', role: 'decode' },
    ],
    // real time: an 8k-token prefill takes ~0.4 s
    defaults: { timeScale: 1, kvHoldTimeoutMs: holdMs },
    clusterDocument: (engines) => ({
      protocol: 'vllm',
      policy: { prefill: 'round_robin', decode: 'round_robin' },
      timeouts: { decodeFirstByteMs: firstByteMs },
      nodes: ['p-now', 'd0', 'd1'].map((id) => ({ id, url: /** @type {any} */ (engines.get(id)).url, role: /** @type {any} */ (engines.get(id)).role })),
    }),
  });
  const engine = (/** @type {string} */ id) => /** @type {import('../../sim/engine.mjs').Engine} */ (stack.cluster.engines.get(id));
  /** @type {{ tMs: number, today: number, now: number }[]} */
  const samples = [];
  const started = performance.now();
  let sampling = true;
  const sampler = (async () => {
    while (sampling) {
      samples.push({ tMs: Math.round(performance.now() - started), today: engine('p-today').stats().heldBlocks, now: engine('p-now').stats().heldBlocks });
      await sleep(sampleMs);
    }
  })();
  let nowAborted = 0;
  let lastLeftAt = 0;
  for (const d of ['d0', 'd1']) engine(d).setFault({ mode: 'slow', delayMs: dDelayMs });
  try {
    for (let i = 0; i < requests; i++) {
      const body = { model: 'sim-model', messages: [{ role: 'user', content: seededText(i + 1, promptTokens * 4, `abandoned ${i}:`) }], max_tokens: 128, stream: true };
      // today: P's answer read, no D told
      const today = fetch(`${engine('p-today').url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-request-id': `today-${i}` },
        body: JSON.stringify({
          ...body,
          stream: false,
          max_tokens: 1,
          kv_transfer_params: { do_remote_decode: true, do_remote_prefill: false, remote_engine_id: null, remote_block_ids: null, remote_host: null, remote_port: null },
        }),
      }).then((r) => r.text());
      // now: the router; whichever D gets the request sits on it without admitting it
      const dBefore = engine('d0').stats().requests.total + engine('d1').stats().requests.total;
      const controller = new AbortController();
      const now = fetch(`${stack.router.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body),
        signal: controller.signal,
      }).then(
        (r) => r.text(),
        () => 'aborted',
      );
      // the client leaves once P answered and D holds the request
      while (engine('d0').stats().requests.total + engine('d1').stats().requests.total <= dBefore) await sleep(5);
      await sleep(20);
      controller.abort();
      if ((await now) === 'aborted') nowAborted++;
      await today;
      lastLeftAt = performance.now();
    }
    await sleep(tailMs);
  } finally {
    sampling = false;
    await sampler;
  }
  const stats = { today: engine('p-today').stats(), now: engine('p-now').stats() };
  const releases = engine('d0').stats().rejectedHandleRequests + engine('d1').stats().rejectedHandleRequests;
  await stack.close();

  const lastLeftMs = Math.round(lastLeftAt - started);
  /** ms from the last client leaving until the held blocks were 0 (null: not within the run) */
  const zeroAfter = (/** @type {'today' | 'now'} */ k) => {
    const s = samples.find((x) => x.tMs >= lastLeftMs && x[k] === 0);
    return s ? s.tMs - lastLeftMs : null;
  };
  const results = /** @type {const} */ (['today', 'now']).map((k) => ({
    policy: k,
    abandonedRequests: requests,
    peakHeldBlocks: Math.max(...samples.map((s) => s[k])),
    heldBlocksAtEnd: samples.at(-1)?.[k] ?? 0,
    heldHandlesAtEnd: stats[k].heldHandles,
    issuedHandles: stats[k].issuedHandles,
    releasedHandles: stats[k].releasedHandles,
    consumedHandles: stats[k].consumedHandles,
    expiredHandles: stats[k].expiredHandles,
    msToZeroAfterLastClientLeft: zeroAfter(k),
  }));
  const report = {
    scenario: 'abandoned',
    config: { requests, promptTokens, tailMs, sampleMs, holdMs, dDelayMs, firstByteMs },
    nowClientsAborted: nowAborted,
    releaseRequests: releases,
    results,
    samples,
  };
  const table = [
    markdownTable(
      ['', 'abandoned requests', 'peak held blocks', 'held blocks at end', 'handles held at end', 'released', 'expired', 'ms to 0 after the last client left'],
      results.map((r) => [
        r.policy,
        r.abandonedRequests,
        r.peakHeldBlocks,
        r.heldBlocksAtEnd,
        r.heldHandlesAtEnd,
        r.releasedHandles,
        r.expiredHandles,
        r.msToZeroAfterLastClientLeft ?? `not within ${tailMs} ms (held until ${holdMs / 1000} s)`,
      ]),
    ),
    '',
    `Held blocks over time (every ${Math.max(sampleMs, 1000)} ms):`,
    '',
    markdownTable(
      ['t (s)', 'today', 'now'],
      samples.filter((_, i) => i % Math.max(1, Math.round(1000 / sampleMs)) === 0).map((s) => [(s.tMs / 1000).toFixed(1), s.today, s.now]),
    ),
  ].join('\n');
  const chart = {
    title: `Prefill blocks held by ${requests} abandoned requests (${promptTokens} tokens each): today vs now`,
    series: ['today', 'now'],
    figures: [
      { name: 'peak held blocks', values: results.map((r) => r.peakHeldBlocks) },
      { name: `held blocks ${tailMs / 1000} s after the last`, values: results.map((r) => r.heldBlocksAtEnd) },
      { name: 'handles released', values: results.map((r) => r.releasedHandles) },
    ],
  };
  return { report, table, chart };
}
