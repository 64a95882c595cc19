import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { startSimCluster } from '../../sim/cluster.mjs';

// GET /metrics of the simulated engines: the real engines' series, with the values the engine
// model computes, and the test-only metrics faults the router's signal tests use.

let cluster;
const eng = (id) => cluster.engines.get(id);
const control = (path, body) =>
  fetch(cluster.controlUrl + path, {
    method: body === undefined ? 'GET' : 'POST',
    headers: { 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
const metrics = (id) => fetch(eng(id).url + '/metrics');
const PREFILL_PARAMS = { do_remote_decode: true, do_remote_prefill: false, remote_engine_id: null, remote_block_ids: null, remote_host: null, remote_port: null };
const text = (tag, n) => Array.from({ length: n }, (_, i) => `${tag}-${i}:`.padEnd(2048, String(i % 10))).join('');

/** Prometheus text: name -> [{ labels, value }], and every family's TYPE. */
function parse(body) {
  const series = new Map();
  const types = new Map();
  for (const line of body.split('\n')) {
    if (!line) continue;
    const t = /^# TYPE (\S+) (\S+)$/.exec(line);
    if (t) types.set(t[1], t[2]);
    if (line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!m) throw new Error(`not Prometheus text: ${line}`);
    const labels = Object.fromEntries([...(m[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)].map((x) => [x[1], x[2]]));
    if (!series.has(m[1])) series.set(m[1], []);
    series.get(m[1]).push({ labels, value: Number(m[3]) });
  }
  return { series, types, one: (name) => series.get(name)?.[0] };
}

beforeAll(async () => {
  cluster = await startSimCluster({
    engines: [
      { id: 'p0', role: 'prefill', numGpuBlocks: 4096 },
      { id: 'd0', role: 'decode', numGpuBlocks: 4096 },
      { id: 'sg', role: 'decode', kind: 'sglang', numGpuBlocks: 4096, sglangHandshakeTimeoutMs: 15000 },
    ],
    defaults: { timeScale: 0 },
  });
});
afterAll(() => cluster?.close());
beforeEach(() => control('/reset', {}));

describe('vLLM /metrics', () => {
  it('serves the v1 series with model_name and engine labels, and the cache config as an info gauge', async () => {
    const res = await metrics('d0');
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toMatch(/^text\/plain; version=0\.0\.4/);
    const m = parse(await res.text());
    for (const name of ['vllm:kv_cache_usage_perc', 'vllm:num_requests_waiting', 'vllm:num_requests_running']) {
      expect(m.types.get(name)).toBe('gauge');
      expect(m.one(name)).toEqual({ labels: { engine: '0', model_name: 'sim-model' }, value: 0 });
    }
    expect(m.series.has('vllm:gpu_cache_usage_perc')).toBe(false);
    const info = m.one('vllm:cache_config_info');
    expect(info.value).toBe(1);
    expect(info.labels).toMatchObject({ block_size: '16', num_gpu_blocks: '4096', engine: '0' });
    expect(m.one('vllm:prompt_tokens_total').value).toBe(0);
  });

  it('reports the KV memory a held handle takes, and frees it when D reads the handle', async () => {
    const prompt = text('m', 4) + 'tail'; // 2049 tokens: 4 units of 32 blocks + 1 block
    const p = await fetch(eng('p0').url + '/v1/completions', {
      method: 'POST',
      body: JSON.stringify({ model: 'sim-model', prompt, max_tokens: 1, kv_transfer_params: PREFILL_PARAMS }),
    });
    const { kv_transfer_params: kv } = await p.json();
    let m = parse(await (await metrics('p0')).text());
    // 4 units of 32 blocks, and a block for the prompt's last token and the first output token, of 4096
    expect(m.one('vllm:kv_cache_usage_perc').value).toBeCloseTo(129 / 4096, 10);
    expect(m.one('vllm:prompt_tokens_total').value).toBe(2049);
    const d = await fetch(eng('d0').url + '/v1/completions', { method: 'POST', body: JSON.stringify({ model: 'sim-model', prompt, max_tokens: 2, kv_transfer_params: kv }) });
    expect(d.status).toBe(200);
    m = parse(await (await metrics('p0')).text());
    expect(m.one('vllm:kv_cache_usage_perc').value).toBe(0); // cached, but free
    expect(eng('p0').stats().cacheBlocksUsed).toBe(4);
  });

  it('counts requests waiting for KV memory and running, as the scheduler has them', async () => {
    await control('/engines/d0/options', { timeScale: 1 });
    try {
      // 4096 blocks of 16 = 65,536 tokens: two 40k-token requests do not fit together
      const body = (tag) => JSON.stringify({ model: 'sim-model', prompt: text(tag, 80), max_tokens: 200, kv_transfer_params: null });
      const a = fetch(eng('d0').url + '/v1/completions', { method: 'POST', body: body('a') });
      const b = fetch(eng('d0').url + '/v1/completions', { method: 'POST', body: body('b') });
      let seen;
      for (let i = 0; i < 200 && !seen; i++) {
        const m = parse(await (await metrics('d0')).text());
        if (m.one('vllm:num_requests_running').value === 1 && m.one('vllm:num_requests_waiting').value === 1) seen = m;
        else await new Promise((r) => setTimeout(r, 25));
      }
      expect(seen).toBeDefined();
      expect(seen.one('vllm:kv_cache_usage_perc').value).toBeGreaterThan(0.6);
      await control('/engines/d0/options', { timeScale: 0 });
      await Promise.all([a, b]);
    } finally {
      await control('/engines/d0/options', { timeScale: 0 });
    }
  });

  it('writes v0’s gpu_cache_usage_perc instead, when asked', async () => {
    await control('/engines/d0/options', { vllmMetrics: 'v0' });
    try {
      const m = parse(await (await metrics('d0')).text());
      expect(m.series.has('vllm:gpu_cache_usage_perc')).toBe(true);
      expect(m.series.has('vllm:kv_cache_usage_perc')).toBe(false);
    } finally {
      await control('/engines/d0/options', { vllmMetrics: 'v1' });
    }
  });
});

describe('SGLang /metrics', () => {
  it('serves token_usage, queue, running and the pool size, with SGLang’s labels', async () => {
    const m = parse(await (await metrics('sg')).text());
    const labels = { engine_type: 'unified', model_name: 'sim-model', pp_rank: '0', tp_rank: '0' };
    for (const name of ['sglang:token_usage', 'sglang:num_queue_reqs', 'sglang:num_running_reqs']) expect(m.one(name)).toEqual({ labels, value: 0 });
    expect(m.one('sglang:max_total_num_tokens').value).toBe(4096 * 16);
  });

  it('writes the sglang_ prefix instead, when asked', async () => {
    await control('/engines/sg/options', { sglangMetricsPrefix: 'sglang_' });
    try {
      const m = parse(await (await metrics('sg')).text());
      expect(m.series.has('sglang_token_usage')).toBe(true);
      expect(m.series.has('sglang:token_usage')).toBe(false);
    } finally {
      await control('/engines/sg/options', { sglangMetricsPrefix: 'sglang:' });
    }
  });
});

describe('metrics faults (POST /engines/:id/metrics-fault)', () => {
  it('override: the real series with the given values', async () => {
    expect((await control('/engines/d0/metrics-fault', { mode: 'override', values: { kvUsage: 0.95, waiting: 3, running: 10 } })).status).toBe(200);
    const m = parse(await (await metrics('d0')).text());
    expect(m.one('vllm:kv_cache_usage_perc').value).toBe(0.95);
    expect(m.one('vllm:num_requests_waiting').value).toBe(3);
    expect(m.one('vllm:num_requests_running').value).toBe(10);
  });

  it('status, garbage and huge', async () => {
    await control('/engines/d0/metrics-fault', { mode: 'status', status: 401 });
    expect((await metrics('d0')).status).toBe(401);
    await control('/engines/d0/metrics-fault', { mode: 'garbage' });
    const g = await metrics('d0');
    expect(g.status).toBe(200);
    const garbage = await g.text();
    expect(() => parse(garbage)).toThrow(/not Prometheus text/);
    await control('/engines/d0/metrics-fault', { mode: 'huge', bytes: 2_000_000 });
    const body = await (await metrics('d0')).text();
    expect(body.length).toBeGreaterThanOrEqual(2_000_000);
    expect(parse(body).one('vllm:kv_cache_usage_perc').value).toBe(0); // valid to the end
  });

  it('slow answers after delayMs; reset clears the fault', async () => {
    await control('/engines/d0/metrics-fault', { mode: 'slow', delayMs: 300 });
    const started = performance.now();
    expect((await metrics('d0')).status).toBe(200);
    expect(performance.now() - started).toBeGreaterThanOrEqual(290);
    await control('/engines/d0/metrics-fault', { mode: 'status', status: 500 });
    await control('/reset', {});
    expect((await metrics('d0')).status).toBe(200);
  });

  it('refuses a malformed fault naming the field', async () => {
    const bad = async (body) => (await (await control('/engines/d0/metrics-fault', body)).json()).error.message;
    expect(await bad({ mode: 'explode' })).toMatch(/mode must be one of/);
    expect(await bad({ mode: 'override', values: { kvUsage: -1 } })).toMatch(/values.kvUsage/);
    expect(await bad({ mode: 'override', values: { queue: 1 } })).toMatch(/values.queue/);
    expect(await bad({ mode: 'status', status: 99 })).toMatch(/status/);
  });
});

describe('a decode node given no KV handle', () => {
  it('vLLM prefills it itself, through its own step loop', async () => {
    const res = await fetch(eng('d0').url + '/v1/completions', { method: 'POST', body: JSON.stringify({ model: 'sim-model', prompt: text('s', 2), max_tokens: 2 }) });
    expect(res.status).toBe(200);
    expect(eng('d0').stats()).toMatchObject({ selfPrefills: 1, blocksPulled: 0 });
    expect(eng('d0').stats().steps).toBeGreaterThanOrEqual(2);
  });

  it('SGLang fails it after the bootstrap handshake retries, as decode.py does', async () => {
    const started = eng('sg').stats().simNowMs;
    const res = await fetch(eng('sg').url + '/v1/completions', { method: 'POST', body: JSON.stringify({ model: 'sim-model', prompt: 'hi', max_tokens: 2 }) });
    expect(res.status).toBe(500);
    expect((await res.json()).error.message).toMatch(/Decode handshake failed .*bootstrap_room=None/);
    expect(eng('sg').stats().simNowMs - started).toBeGreaterThanOrEqual(15000 - 1e-6);
    expect(eng('sg').stats().selfPrefills).toBe(0);
  });
});
