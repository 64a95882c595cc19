// `handle-retry`: after a D attempt failed (its handle is single-use), which retry gives the
// client its first token sooner, in the simulator's time model?
//   rerun-p:  P runs again for a fresh handle (same P: the prompt is in its prefix cache), then a
//             second D pulls the KV — what the router does.
//   plain-d:  the second D gets the client's body without kv_transfer_params and prefills the
//             whole prompt itself.
// Engines only (no router): the figures are the engines' simulated TTFT (queue + prefill +
// transfer + first decode step), the same figures `multiturn` reports.
//
// `npm run bench -- handle-retry [--sizes 2048,8192,32768] [--json bench/results/handle-retry.json]`
import { stringOption } from '../lib/args.mjs';
import { markdownTable } from '../lib/report.mjs';
import { seededText } from '../lib/text.mjs';
import { startSimCluster } from '../../sim/cluster.mjs';

const PREFILL_KV = { do_remote_decode: true, do_remote_prefill: false, remote_engine_id: null, remote_block_ids: null, remote_host: null, remote_port: null };

/** @param {string} url @param {object} body @param {string} id */
async function post(url, body, id) {
  const res = await fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-request-id': id }, body: JSON.stringify(body) });
  if (res.status !== 200) throw new Error(`${url}: HTTP ${res.status} ${await res.text()}`);
  return /** @type {any} */ (await res.json());
}

/** @param {Record<string, string | true>} options */
export async function runHandleRetry(options) {
  const sizes = String(stringOption(options, 'sizes') ?? '2048,8192,32768')
    .split(',')
    .map(Number);
  // timeScale 0: nothing sleeps, the engines still account simulated ms
  const cluster = await startSimCluster({
    defaults: { timeScale: 0 },
    engines: [
      { id: 'p0', role: 'prefill' },
      ...sizes.flatMap((_, i) => [
        { id: `d-rerun-${i}`, role: /** @type {const} */ ('decode') },
        { id: `d-plain-${i}`, role: /** @type {const} */ ('decode') },
      ]),
    ],
  });
  const engine = (/** @type {string} */ id) => /** @type {any} */ (cluster.engines.get(id));
  const results = [];
  try {
    for (const [i, tokens] of sizes.entries()) {
      const client = { model: 'sim-model', messages: [{ role: 'user', content: seededText(100 + i, tokens * 4, `retry ${tokens}:`) }], max_tokens: 4 };
      const prefillBody = { ...client, stream: false, max_tokens: 1, kv_transfer_params: PREFILL_KV };
      // the first attempt's prefill (its D failed): the prompt is now in P's prefix cache
      await post(engine('p0').url, prefillBody, `first-${i}`);
      // rerun-p: a fresh handle from the same P, then another D
      const again = await post(engine('p0').url, prefillBody, `rerun-${i}`);
      await post(engine(`d-rerun-${i}`).url, { ...client, kv_transfer_params: again.kv_transfer_params }, `rerun-${i}`);
      // plain-d: another D prefills the prompt itself
      await post(engine(`d-plain-${i}`).url, client, `plain-${i}`);
      const rerun = engine(`d-rerun-${i}`).stats();
      const plain = engine(`d-plain-${i}`).stats();
      const p = engine('p0').requestStats()[`rerun-${i}`];
      results.push({
        promptTokens: tokens,
        rerunPTtftMs: Math.round(rerun.ttftMs.at(-1)),
        plainDTtftMs: Math.round(plain.ttftMs.at(-1)),
        rerunPCachedShare: Math.round((p.cachedTokens / p.promptTokens) * 1000) / 1000,
        rerunPBlocksPulled: rerun.blocksPulled,
        plainDPrefilledTokens: plain.promptTokens - plain.cachedTokens,
      });
    }
  } finally {
    await cluster.close();
  }
  const table = markdownTable(
    ['prompt tokens', 'TTFT re-run P (ms)', 'TTFT plain body to D (ms)', "P's cache hit on the re-run", 'blocks D pulls', 'tokens D prefills (plain)'],
    results.map((r) => [r.promptTokens, r.rerunPTtftMs, r.plainDTtftMs, r.rerunPCachedShare, r.rerunPBlocksPulled, r.plainDPrefilledTokens]),
  );
  const chart = {
    title: 'Simulated TTFT of a D retry: re-run P (fresh handle) vs plain body to D',
    series: ['re-run P', 'plain body to D'],
    figures: results.map((r) => ({ name: `${r.promptTokens} tokens (ms)`, values: [r.rerunPTtftMs, r.plainDTtftMs] })),
  };
  return { report: { scenario: 'handle-retry', results: results.map((r) => ({ policy: `${r.promptTokens}`, ...r })) }, table, chart };
}
