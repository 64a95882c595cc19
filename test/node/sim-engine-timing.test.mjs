import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { startSimCluster } from '../../sim/cluster.mjs';

// timeScale 1: simulated ms are real ms, so concurrent requests really overlap. The mechanisms
// themselves are tested deterministically on the model (sim-model-*.test.mjs); this checks them
// through the engine's HTTP layer.
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

describe('time model over HTTP', () => {
  it('answers a prefill leg with the token of its last prefill step', async () => {
    const res = await post('c0', { prompt: blocks('a', 4), max_tokens: 1 }); // 2048 tokens
    expect(res.status).toBe(200);
    const [ttft] = eng('c0').stats().ttftMs;
    // one step of 2048 tokens at 0.05 ms a token, plus their attention; no separate decode step
    expect(ttft).toBeGreaterThanOrEqual(102.4);
    expect(ttft).toBeLessThan(102.4 + 15);
  });

  /**
   * `pull()` (a D leg that pulls 20 blocks onto d0, 100 ms at the link's rate) while d0 decodes
   * another request: 200 tokens (3.2 s), its first token read before the pull starts, so the pull
   * overlaps it even on a slow machine. d0's stats once the pull answered; the decode is left then.
   */
  async function duringDecode(pull) {
    const client = new AbortController();
    const res = await fetch(eng('d0').url + '/v1/completions', {
      method: 'POST',
      body: JSON.stringify({ prompt: 'x', max_tokens: 200, stream: true, kv_transfer_params: null }),
      signal: client.signal,
    });
    const reader = res.body.getReader();
    await reader.read(); // d0 decodes it now
    await new Promise((r) => setTimeout(r, 60)); // a few steps of it alone
    const answer = await pull();
    expect(answer.status).toBe(200);
    const { itlMs, ingestStallMs } = eng('d0').stats();
    client.abort();
    await reader.cancel().catch(() => undefined);
    return { itlMs: [...itlMs], ingestStallMs };
  }

  it('slows decode steps by the sequences decoding and by KV landing on the node', async () => {
    // its P is unknown, so all of the pull stalls
    const { itlMs: itl, ingestStallMs } = await duringDecode(() =>
      post('d0', {
        prompt: blocks('z', 20),
        max_tokens: 1,
        kv_transfer_params: {
          do_remote_prefill: true,
          do_remote_decode: false,
          remote_engine_id: 'p0',
          remote_block_ids: [],
          remote_host: '127.0.0.1',
          remote_port: eng('p0').port,
        },
      }),
    );
    expect(itl.some((x) => Math.abs(x - 16) < 0.01)).toBe(true); // alone: 15 + 1
    // while KV lands at the link's rate, landing costs the step as much again (5 ms a block each)
    expect(itl.some((x) => x >= 16 * 1.5)).toBe(true);
    expect(ingestStallMs).toBeGreaterThan(0);
  });

  /** P's leg of request `id` on p0, then its D leg on d0 while d0 decodes another request: d0's step time lost to the pull. */
  async function pullWhileDecoding(prompt, id) {
    const pRes = await post('p0', { prompt, max_tokens: 1, kv_transfer_params: { do_remote_decode: true } }, { 'x-request-id': id });
    expect(pRes.status).toBe(200);
    const { kv_transfer_params: kv } = await pRes.json();
    const { ingestStallMs } = await duringDecode(() => post('d0', { prompt, max_tokens: 1, kv_transfer_params: kv }, { 'x-request-id': id }));
    return ingestStallMs;
  }

  it("a decode node's pull of the KV its P just computed for the request does not stall its steps (seed 000: P+D affinity's ITL p99 is its TPOT p99)", async () => {
    // P prefilled all 20 blocks for this request: it streams them as its layers finish
    expect(await pullWhileDecoding(blocks('f', 20), 'fresh')).toBe(0);
  });

  it("a decode node's pull of context its P held from before stalls its steps, as a mesh fetch does", async () => {
    const prompt = blocks('h', 20);
    // an earlier request left the prompt in p0's cache: this request's P leg computes none of it
    const warm = await post('p0', { prompt, max_tokens: 1 }, { 'x-request-id': 'warm' });
    expect(warm.status).toBe(200);
    expect(await pullWhileDecoding(prompt, 'held')).toBeGreaterThan(0);
  });
});
