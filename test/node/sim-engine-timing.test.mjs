import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { startSimCluster } from '../../sim/cluster.mjs';

// timeScale 1: simulated ms are real ms, so concurrent requests really overlap
let cluster;
const eng = (id) => cluster.engines.get(id);
const post = (id, body, headers = {}) => fetch(eng(id).url + '/v1/completions', { method: 'POST', headers, body: JSON.stringify(body) });
const blocks = (tag, n) => Array.from({ length: n }, (_, i) => `${tag}${i}`.padEnd(2048, '.')).join('');

beforeAll(async () => {
  cluster = await startSimCluster({
    engines: [
      { id: 'p0', role: 'prefill' },
      { id: 'd0', role: 'decode' },
      { id: 'c0', role: 'both' },
    ],
    defaults: { timeScale: 1 },
  });
});
afterAll(() => cluster?.close());
beforeEach(() => fetch(cluster.controlUrl + '/reset', { method: 'POST' }));

describe('time model', () => {
  it('queues prefills on one node: the second waits for the first', async () => {
    const prompt = (tag) => blocks(tag, 4); // 2048 tokens: 102.4 ms of prefill each
    await Promise.all([post('c0', { prompt: prompt('a'), max_tokens: 1 }), post('c0', { prompt: prompt('b'), max_tokens: 1 })]);
    const ttft = eng('c0')
      .stats()
      .ttftMs.sort((x, y) => x - y);
    expect(ttft[0]).toBeGreaterThanOrEqual(102.4 + 16);
    expect(ttft[1]).toBeGreaterThanOrEqual(ttft[0] + 80); // queued behind ~102 ms of work
  });

  it('slows decode steps by the sequences decoding and by an incoming transfer', async () => {
    const long = post('d0', { prompt: 'x', max_tokens: 25, stream: false, kv_transfer_params: null });
    await new Promise((r) => setTimeout(r, 60));
    // a 20-block pull lands on d0 while it decodes: 100 ms of transfer interference
    const pull = post('d0', {
      prompt: blocks('z', 20),
      max_tokens: 1,
      kv_transfer_params: { do_remote_prefill: true, do_remote_decode: false, remote_engine_id: 'p0', remote_block_ids: [], remote_host: '127.0.0.1', remote_port: eng('p0').port },
    });
    await Promise.all([long, pull]);
    const itl = eng('d0').stats().itlMs;
    expect(itl).toContain(16); // alone: 15 + 1
    expect(itl.some((x) => x >= 15 + 1 + 20)).toBe(true); // during the transfer
  });
});
