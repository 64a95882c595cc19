import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { startSimCluster } from '../../sim/cluster.mjs';
import { resolveModel } from '../../sim/presets.mjs';
import { stepTime } from '../../sim/model/step-time.mjs';

const BLOCK_CHARS = 512 * 4;
/** n full blocks of distinct text (block i of conversation c), plus `extra` characters */
const text = (c, n, extra = 0) => Array.from({ length: n }, (_, i) => `${c}-${i}:`.padEnd(BLOCK_CHARS, String(i % 10))).join('') + 'x'.repeat(extra);

const PREFILL_PARAMS = { do_remote_decode: true, do_remote_prefill: false, remote_engine_id: null, remote_block_ids: null, remote_host: null, remote_port: null };

let cluster;
const eng = (id) => cluster.engines.get(id);
const post = (id, path, body, headers = {}) =>
  fetch(eng(id).url + path, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: typeof body === 'string' ? body : JSON.stringify(body) });

/** The router's vllm flow by hand: P leg, then D leg with P's kv_transfer_params. */
async function pd(p, d, prompt, requestId, extra = {}) {
  const pRes = await post(p, '/v1/completions', { model: 'sim-model', prompt, max_tokens: 1, stream: false, kv_transfer_params: PREFILL_PARAMS }, { 'x-request-id': requestId });
  expect(pRes.status).toBe(200);
  const pJson = await pRes.json();
  const dRes = await post(
    d,
    '/v1/completions',
    { model: 'sim-model', prompt, max_tokens: 4, ...extra, kv_transfer_params: pJson.kv_transfer_params },
    { 'x-request-id': requestId },
  );
  expect(dRes.status).toBe(200);
  return { pJson, dJson: await dRes.json() };
}

beforeAll(async () => {
  cluster = await startSimCluster({
    engines: [
      { id: 'p0', role: 'prefill' },
      { id: 'p1', role: 'prefill' },
      { id: 'd0', role: 'decode' },
      { id: 'd1', role: 'decode' },
      { id: 'c0', role: 'both' },
    ],
    defaults: { timeScale: 0 },
  });
});
afterAll(() => cluster?.close());
beforeEach(() => fetch(cluster.controlUrl + '/reset', { method: 'POST' }));

describe('vllm prefill leg', () => {
  it('prefills and returns kv_transfer_params and usage', async () => {
    const prompt = text('a', 3, 100); // 1561 tokens: 3 full blocks + a partial one
    const { pJson } = await pd('p0', 'd0', prompt, 'r1');
    expect(pJson.object).toBe('text_completion');
    expect(pJson.choices).toHaveLength(1);
    expect(pJson.kv_transfer_params).toEqual({
      do_remote_prefill: true,
      do_remote_decode: false,
      remote_engine_id: 'p0',
      remote_block_ids: [0, 1, 2, 3],
      remote_host: '127.0.0.1',
      remote_request_id: expect.stringMatching(/^cmpl-r1-/),
      remote_port: eng('p0').port,
      tp_size: 1,
      remote_num_tokens: 1561,
    });
    // vLLM leaves prompt_tokens_details out when nothing was cached
    expect(pJson.usage).toEqual({ prompt_tokens: 1561, completion_tokens: 1, total_tokens: 1562 });
    const s = eng('p0').stats();
    expect(s.requests.vllmPrefill).toBe(1);
    expect(s.promptTokens).toBe(1561);
    expect(s.blocksLookedUp).toBe(3);
    expect(s.protocolViolations).toBe(0);
  });

  it('reports the cached prefix on the next turn', async () => {
    await pd('p0', 'd0', text('a', 3, 100), 'r1');
    const { pJson } = await pd('p0', 'd0', text('a', 3, 100) + text('turn2', 2), 'r2');
    expect(pJson.usage.prompt_tokens_details.cached_tokens).toBe(3 * 512);
    const s = eng('p0').stats();
    expect(s.blocksHit).toBe(3);
    expect(s.cachedTokens).toBe(3 * 512);
  });

  it('records protocol violations but still answers', async () => {
    const res = await post('p0', '/v1/chat/completions', {
      model: 'sim-model',
      messages: [{ role: 'user', content: 'hi' }],
      max_tokens: 1,
      stream: false,
      stream_options: { include_usage: true },
      min_tokens: 2,
      kv_transfer_params: PREFILL_PARAMS,
    });
    expect(res.status).toBe(200);
    const json = await res.json();
    expect(json.object).toBe('chat.completion');
    expect(json.kv_transfer_params.remote_engine_id).toBe('p0');
    const s = eng('p0').stats();
    expect(s.protocolViolations).toBe(2);
    expect(s.violations.join(' ')).toMatch(/stream_options.*min_tokens/);
  });

  it('flags a prefill leg that is not max_tokens:1, stream:false', async () => {
    await post('p0', '/v1/completions', { model: 'sim-model', prompt: 'hi', max_tokens: 9, stream: true, kv_transfer_params: PREFILL_PARAMS });
    expect(eng('p0').stats().protocolViolations).toBe(2);
  });
});

describe('vllm decode leg', () => {
  it('pulls the whole context on a cold D, only the suffix afterwards', async () => {
    const turn1 = text('a', 3, 100);
    const { dJson } = await pd('p0', 'd0', turn1, 'r1');
    expect(dJson.choices[0].text.split(' ')).toHaveLength(4);
    // D counts the KV it pulled from P as cached (vLLM num_cached_tokens includes external tokens)
    expect(dJson.usage).toMatchObject({ prompt_tokens: 1561, completion_tokens: 4, prompt_tokens_details: { cached_tokens: 1561 } });
    let d = eng('d0').stats();
    expect(d.requests.vllmDecode).toBe(1);
    expect(d.fullRepulls).toBe(1);
    expect(d.blocksPulled).toBe(4);
    expect(d.ttftMs).toHaveLength(1);
    expect(d.itlMs).toHaveLength(3);
    expect(d.tpotMs).toHaveLength(1);

    const turn2 = turn1 + text('turn2', 2);
    const second = await pd('p0', 'd0', turn2, 'r2');
    expect(second.dJson.usage.prompt_tokens_details.cached_tokens).toBe(second.dJson.usage.prompt_tokens);
    d = eng('d0').stats();
    expect(d.fullRepulls).toBe(1);
    expect(d.suffixPulls).toBe(1);
    expect(d.blocksPulled).toBe(4 + (Math.ceil(turn2.length / 4 / 512) - 3));

    // the same conversation landing on another D: it holds nothing, so everything moves
    await pd('p0', 'd1', turn2, 'r3');
    expect(eng('d1').stats().fullRepulls).toBe(1);
    expect(eng('d1').stats().suffixPulls).toBe(0);
  });

  it('adds the prefill time of the same request id to its simulated TTFT', async () => {
    const prompt = text('t', 8); // 4096 tokens: ~205 ms of prefill, a 40 ms transfer (5 ms a 512 tokens)
    await pd('p0', 'd0', prompt, 'ttft-1');
    const [ttft] = eng('d0').stats().ttftMs;
    // P's one prefill step + the transfer + D's step computing the prompt's last token (the first output token)
    const { cost } = resolveModel({});
    const prefill = stepTime(cost, { decodeContexts: [], prefills: [{ tokens: 4096, context: 0 }] }).ms;
    const first = stepTime(cost, { decodeContexts: [], prefills: [{ tokens: 1, context: 4095 }] }).ms;
    expect(ttft).toBeCloseTo(prefill + 8 * 5 + first, 5);
  });

  it('flags kv_transfer_params that do not name a real prefill engine', async () => {
    const kv = { do_remote_prefill: true, do_remote_decode: false, remote_block_ids: [0], remote_host: '127.0.0.1', remote_request_id: 'x' };
    await post('d0', '/v1/completions', { model: 'sim-model', prompt: 'hi', kv_transfer_params: { ...kv, remote_engine_id: 'ghost', remote_port: 1 } });
    await post('d0', '/v1/completions', { model: 'sim-model', prompt: 'hi', kv_transfer_params: { ...kv, remote_engine_id: 'p0', remote_port: 1 } });
    const s = eng('d0').stats();
    expect(s.protocolViolations).toBe(2);
    expect(s.violations[0]).toMatch(/unknown remote_engine_id ghost/);
    expect(s.violations[1]).toMatch(/remote_port 1/);
  });

  it('prefills by itself when kv_transfer_params is null', async () => {
    const res = await post('d0', '/v1/completions', { model: 'sim-model', prompt: text('s', 2), max_tokens: 2, kv_transfer_params: null });
    expect(res.status).toBe(200);
    const d = eng('d0').stats();
    expect(d.selfPrefills).toBe(1);
    expect(d.blocksPulled).toBe(0);
  });

  it('counts locality misses: blocks another engine held', async () => {
    await pd('p0', 'd0', text('a', 3), 'r1');
    await pd('p1', 'd0', text('a', 3) + text('b', 1), 'r2');
    // p1 lacked 3 blocks that p0 (and d0) held; d0 pulled only p1's new block
    expect(eng('p1').stats().localityMissBlocks).toBe(3);
    expect(eng('d0').stats().localityMissBlocks).toBe(0);
  });
});

describe('colocated and plain OpenAI', () => {
  it('streams the first token at once, then one event every streamInterval tokens, and the last with the rest (vLLM --stream-interval)', async () => {
    /** the events of a 10-token stream: each one's text, and the usage frame's count */
    const events = async () => {
      const res = await post('c0', '/v1/chat/completions', {
        model: 'sim-model',
        messages: [{ role: 'user', content: 'hi' }],
        max_tokens: 10,
        stream: true,
        stream_options: { include_usage: true },
      });
      const data = (await res.text())
        .split('\n\n')
        .filter((e) => e.startsWith('data: {'))
        .map((e) => JSON.parse(e.slice(6)));
      return {
        words: data.filter((d) => d.choices.length).map((d) => d.choices[0].delta.content.split(' ').filter(Boolean).length),
        role: data[0].choices[0].delta.role,
        usage: data.at(-1).usage.completion_tokens,
      };
    };
    expect(await events()).toEqual({ words: [1, 1, 1, 1, 1, 1, 1, 1, 1, 1], role: 'assistant', usage: 10 });
    const options = (o) => fetch(`${cluster.controlUrl}/engines/c0/options`, { method: 'POST', body: JSON.stringify(o) });
    await options({ streamInterval: 4 });
    try {
      // tokens 1 | 2-5 | 6-9 | 10 (vllm/v1/engine/output_processor.py make_request_output)
      expect(await events()).toEqual({ words: [1, 4, 4, 1], role: 'assistant', usage: 10 });
    } finally {
      await options({ streamInterval: 1 });
    }
  });

  it('serves chat with content parts and counts tokens from the rendered messages', async () => {
    const res = await post('c0', '/v1/chat/completions', {
      model: 'sim-model',
      max_tokens: 3,
      messages: [
        { role: 'system', content: 'abcd' },
        {
          role: 'user',
          content: [
            { type: 'text', text: 'efgh' },
            { type: 'image_url', image_url: {} },
          ],
        },
      ],
    });
    expect(res.status).toBe(200);
    const json = await res.json();
    // "system: abcd\nuser: efgh" = 23 chars -> 6 tokens
    expect(json.usage).toEqual({ prompt_tokens: 6, completion_tokens: 3, total_tokens: 9 });
    expect(json.choices[0].message.role).toBe('assistant');
    expect(json.choices[0].finish_reason).toBe('length');
    expect(eng('c0').stats().requests.colocated).toBe(1);
  });

  it('counts a token-id prompt as its length', async () => {
    const res = await post('c0', '/v1/completions', { model: 'sim-model', prompt: Array.from({ length: 1030 }, (_, i) => i) });
    const json = await res.json();
    expect(json.usage.prompt_tokens).toBe(1030);
    expect(json.usage.completion_tokens).toBe(16);
    expect(eng('c0').stats().blocksLookedUp).toBe(2);
  });

  it('answers 404 for an unknown model and 400 for bad JSON', async () => {
    const a = await post('c0', '/v1/completions', { model: 'nope', prompt: 'x' });
    expect(a.status).toBe(404);
    expect((await a.json()).error.code).toBe('model_not_found');
    const b = await post('c0', '/v1/completions', '{not json');
    expect(b.status).toBe(400);
    expect((await b.json()).error).toHaveProperty('message');
  });

  it('lists models and answers health', async () => {
    const models = await (await fetch(eng('c0').url + '/v1/models')).json();
    expect(models).toMatchObject({ object: 'list', data: [{ id: 'sim-model', object: 'model', owned_by: 'sim' }] });
    const health = await fetch(eng('c0').url + '/health');
    expect(health.status).toBe(200);
    expect(await health.json()).toEqual({ status: 'ok' });
  });

  it('logs the requests it received', async () => {
    await post('c0', '/v1/completions', '{"model":"sim-model","prompt":"hello"}', { 'X-Request-Id': 'abc' });
    const [entry] = eng('c0').requests();
    expect(entry).toMatchObject({ path: '/v1/completions', body: '{"model":"sim-model","prompt":"hello"}' });
    expect(entry.headers['x-request-id']).toBe('abc');
    expect(typeof entry.receivedAt).toBe('number');
  });
});
