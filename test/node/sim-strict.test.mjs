// The simulator is as strict as the real engines where the router depends on it (see
// docs/engines.md for the upstream sources): answers tell their prompt, vLLM handles are
// single-use and held until read, released or expired, usage as vLLM reports it, one handle per
// batched response, the Mooncake flow, SGLang's early headers and abort on disconnect, SGLang's
// generating /health, duplicate request ids.
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { expectedPrefix, startSimCluster } from '../../sim/cluster.mjs';

const PREFILL_PARAMS = { do_remote_decode: true, do_remote_prefill: false, remote_engine_id: null, remote_block_ids: null, remote_host: null, remote_port: null };
const DEFAULTS = {
  timeScale: 0,
  prefillMsPerToken: 0.05,
  kvHoldTimeoutMs: 480000,
  rejectionReleasesHandle: true,
  sglangAbortGraceMs: 4000,
  sglangStreamAbortGraceMs: 50,
  healthGenerate: false,
  rejectDuplicateRequestIds: true,
};

let cluster;
const eng = (id) => cluster.engines.get(id);
const post = (id, path, body, headers = {}, signal) =>
  fetch(eng(id).url + path, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: typeof body === 'string' ? body : JSON.stringify(body), signal });
const text = (c, chars) => `${c}:`.padEnd(chars, c);
const firstText = (json) => json.choices[0].text ?? json.choices[0].message.content;

async function prefill(p, body, requestId = 'r1') {
  const res = await post(p, '/v1/completions', { ...body, max_tokens: 1, stream: false, kv_transfer_params: PREFILL_PARAMS }, { 'x-request-id': requestId });
  expect(res.status).toBe(200);
  return res.json();
}
const decode = (d, body, kv, requestId = 'r1') => post(d, '/v1/completions', { ...body, kv_transfer_params: kv }, { 'x-request-id': requestId });

beforeAll(async () => {
  cluster = await startSimCluster({
    engines: [
      { id: 'p0', role: 'prefill' },
      { id: 'd0', role: 'decode' },
      { id: 'd1', role: 'decode' },
      { id: 'c0', role: 'both' },
    ],
    defaults: { timeScale: 0, bootstrapTimeoutMs: 300 },
  });
});
afterAll(() => cluster?.close());
beforeEach(async () => {
  for (const e of cluster.engines.values()) e.setOptions(DEFAULTS);
  await fetch(cluster.controlUrl + '/reset', { method: 'POST' });
});

describe('answers tell which prompt they belong to', () => {
  it('starts every answer with the digest of its prompt', async () => {
    const body = { model: 'sim-model', prompt: 'hello there', max_tokens: 3 };
    const json = await (await post('c0', '/v1/completions', body)).json();
    expect(firstText(json).startsWith(expectedPrefix(body))).toBe(true);
    const chat = { model: 'sim-model', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 };
    const chatJson = await (await post('c0', '/v1/chat/completions', chat)).json();
    expect(firstText(chatJson).startsWith(expectedPrefix(chat))).toBe(true);
    expect(expectedPrefix(chat)).not.toBe(expectedPrefix(body));
  });
});

describe('a vLLM handle is single-use', () => {
  it('answers the first D right and a second D with the same handle 200 with wrong text', async () => {
    const body = { model: 'sim-model', prompt: text('a', 3000), max_tokens: 3 };
    const p = await prefill('p0', body);
    expect(eng('p0').stats()).toMatchObject({ heldHandles: 1, heldBlocks: 2, issuedHandles: 1 });
    const first = await decode('d0', body, p.kv_transfer_params);
    expect(first.status).toBe(200);
    expect(firstText(await first.json()).startsWith(expectedPrefix(body))).toBe(true);
    expect(eng('p0').stats()).toMatchObject({ heldHandles: 0, heldBlocks: 0, consumedHandles: 1 });

    const second = await decode('d1', body, p.kv_transfer_params, 'r2');
    expect(second.status).toBe(200);
    expect(firstText(await second.json()).startsWith(expectedPrefix(body))).toBe(false);
    expect(eng('d1').stats().staleHandleReads).toBe(1);
  });

  it('answers a handle P never issued with wrong text', async () => {
    const body = { model: 'sim-model', prompt: 'x', max_tokens: 2 };
    const kv = {
      do_remote_prefill: true,
      do_remote_decode: false,
      remote_engine_id: 'p0',
      remote_request_id: 'nope',
      remote_block_ids: [0],
      remote_host: '127.0.0.1',
      remote_port: eng('p0').port,
      tp_size: 1,
    };
    const res = await decode('d0', body, kv);
    expect(res.status).toBe(200);
    expect(firstText(await res.json()).startsWith(expectedPrefix(body))).toBe(false);
    expect(eng('d0').stats().staleHandleReads).toBe(1);
  });
});

describe('P holds the blocks of an unread handle', () => {
  it('until the hold timeout; a D reading it afterwards gets wrong text', async () => {
    eng('p0').setOptions({ kvHoldTimeoutMs: 30 });
    const body = { model: 'sim-model', prompt: text('b', 5000), max_tokens: 2 };
    const p = await prefill('p0', body);
    expect(eng('p0').stats().heldBlocks).toBe(3);
    await new Promise((r) => setTimeout(r, 80));
    expect(eng('p0').stats()).toMatchObject({ heldHandles: 0, heldBlocks: 0, expiredHandles: 1 });
    const late = await decode('d0', body, p.kv_transfer_params);
    expect(firstText(await late.json()).startsWith(expectedPrefix(body))).toBe(false);
  });

  it('until a D rejects a request carrying it before admission (404 model): P frees it at once', async () => {
    const body = { model: 'sim-model', prompt: text('c', 3000), max_tokens: 2 };
    const p = await prefill('p0', body);
    const res = await post('d0', '/v1/completions', { model: 'pd-release', prompt: 'x', max_tokens: 1, stream: false, kv_transfer_params: p.kv_transfer_params });
    expect(res.status).toBe(404);
    expect(eng('p0').stats()).toMatchObject({ heldHandles: 0, releasedHandles: 1 });
    expect(eng('d0').stats().rejectedHandleRequests).toBe(1);
  });

  it('not on a body the framework rejects (invalid JSON), nor on vLLM before the rejection hook', async () => {
    const body = { model: 'sim-model', prompt: text('d', 3000), max_tokens: 2 };
    const p = await prefill('p0', body);
    expect((await post('d0', '/v1/completions', `{"kv_transfer_params": ${JSON.stringify(p.kv_transfer_params)},`)).status).toBe(400);
    eng('d0').setOptions({ rejectionReleasesHandle: false });
    expect((await post('d0', '/v1/completions', { model: 'pd-release', prompt: 'x', kv_transfer_params: p.kv_transfer_params })).status).toBe(404);
    expect(eng('p0').stats()).toMatchObject({ heldHandles: 1, releasedHandles: 0 });
  });
});

describe('usage as vLLM reports it', () => {
  it('leaves prompt_tokens_details out when nothing was cached; D counts pulled KV as cached', async () => {
    const body = { model: 'sim-model', prompt: text('e', 2100), max_tokens: 2 };
    const p = await prefill('p0', body);
    expect(p.usage.prompt_tokens_details).toBeUndefined();
    const d = await (await decode('d0', body, p.kv_transfer_params)).json();
    expect(d.usage.prompt_tokens_details.cached_tokens).toBe(d.usage.prompt_tokens);
  });
});

describe('batched /v1/completions and n > 1 on a vLLM P', () => {
  it('returns one handle for the whole batch and holds every prompt', async () => {
    const body = { model: 'sim-model', prompt: ['one ' + text('f', 1200), 'two', 'three'], max_tokens: 2 };
    const p = await prefill('p0', body);
    expect(p.choices).toHaveLength(3);
    expect(p.kv_transfer_params.remote_request_id).toEqual(expect.any(String));
    expect(eng('p0').stats()).toMatchObject({ heldHandles: 3, issuedHandles: 3 });

    const d = await (await decode('d0', body, p.kv_transfer_params)).json();
    expect(d.choices).toHaveLength(3);
    expect(d.choices[0].text.startsWith(expectedPrefix(body, 0))).toBe(true);
    expect(d.choices[1].text.startsWith(expectedPrefix(body, 1))).toBe(false);
    expect(d.choices[2].text.startsWith(expectedPrefix(body, 2))).toBe(false);
    expect(eng('d0').stats().foreignHandleReads).toBe(2);
    // prompts 2 and 3 were never read: their blocks stay held until the timeout
    expect(eng('p0').stats().heldHandles).toBe(2);
  });

  it('holds one handle per sample when P gets n > 1, returning one', async () => {
    await prefill('p0', { model: 'sim-model', prompt: 'hi', n: 3 });
    expect(eng('p0').stats()).toMatchObject({ heldHandles: 3, issuedHandles: 3 });
  });
});

describe('vLLM MooncakeConnector flow', () => {
  const mooncake = async (body, { engineId, addr, transferId = 'xfer-1', pTransferId = transferId } = {}) => {
    const query = await (await fetch(eng('p0').url + '/query')).json();
    const id = engineId ?? query['0'].engine_id;
    const pRes = post(
      'p0',
      '/v1/completions',
      { ...body, max_tokens: 1, stream: false, kv_transfer_params: { do_remote_decode: true, do_remote_prefill: false, transfer_id: pTransferId } },
      { 'x-request-id': 'm1' },
    );
    const dRes = post(
      'd0',
      '/v1/completions',
      {
        ...body,
        kv_transfer_params: {
          do_remote_decode: false,
          do_remote_prefill: true,
          remote_bootstrap_addr: addr ?? `http://127.0.0.1:${eng('p0').bootstrapPort}`,
          remote_engine_id: id,
          transfer_id: transferId,
        },
      },
      { 'x-request-id': 'm1' },
    );
    return { p: await pRes, d: await dRes, engineId: id };
  };

  it('serves P and D sent concurrently, D told P bootstrap address and engine id', async () => {
    const body = { model: 'sim-model', prompt: text('g', 3000), max_tokens: 3 };
    const { p, d, engineId } = await mooncake(body);
    expect(engineId).toBe(eng('p0').mooncakeEngineId);
    expect((await p.json()).kv_transfer_params).toBeNull();
    expect(d.status).toBe(200);
    expect(firstText(await d.json()).startsWith(expectedPrefix(body))).toBe(true);
    expect(eng('d0').stats().requests.mooncakeDecode).toBe(1);
    expect(eng('p0').stats().heldHandles).toBe(0);
  });

  it('fails D when the engine id does not match P, and times D out when P got no transfer_id', async () => {
    const body = { model: 'sim-model', prompt: 'hi', max_tokens: 2 };
    expect((await mooncake(body, { engineId: 'p0' })).d.status).toBe(500);
    const { d } = await mooncake(body, { transferId: 'xfer-2', pTransferId: '' });
    expect(d.status).toBe(504);
  });
});

describe('SGLang prefill leg', () => {
  const room = (prompt, extra = '') =>
    `{"model":"sim-model","prompt":"${prompt}","max_tokens":3${extra},"bootstrap_host":"127.0.0.1","bootstrap_port":${eng('p0').bootstrapPort},"bootstrap_room":12345678901234567890}`;

  it('sends stream headers at once and the body after the prefill', async () => {
    // The order, not a time bound: when the headers arrive the prefill has made no token yet. Its
    // 1.5 s is the margin for a busy machine to deliver them (298 ms seen under load).
    eng('p0').setOptions({ timeScale: 1, prefillMsPerToken: 1 }); // 'x'*6000 -> 1500 tokens -> 1.5 s
    const t0 = performance.now();
    const res = await post('p0', '/v1/completions', room('x'.repeat(6000), ',"stream":true'));
    expect(res.status).toBe(200);
    expect(eng('p0').stats().outputTokens).toBe(0);
    const body = await res.text();
    expect(eng('p0').stats().outputTokens).toBe(1);
    expect(body).toContain('data: [DONE]');
    expect(performance.now() - t0).toBeGreaterThanOrEqual(1450);
  });

  it('aborts when its client leaves before the prefill ends; D fails with a transfer error', async () => {
    // a 3 s prefill: the client's leaving reaches P long before it ends, however busy the machine
    // (200 ms was outrun under load: the prefill ended first and nothing was aborted)
    eng('p0').setOptions({ timeScale: 1, prefillMsPerToken: 1, sglangStreamAbortGraceMs: 20 });
    const ac = new AbortController();
    const d = post('d0', '/v1/completions', room('x'.repeat(12000), ',"stream":true'));
    const p = await post('p0', '/v1/completions', room('x'.repeat(12000), ',"stream":true'), {}, ac.signal);
    expect(p.status).toBe(200);
    ac.abort(); // what a router does when it drops P's response on its headers
    const dRes = await d;
    const body = await dRes.text();
    expect(body).toMatch(/KVTransferError\(bootstrap_room=12345678901234567890\): Aborted by AbortReq/);
    expect(eng('p0').stats().sglangAborts).toBe(1);
    // the aborted prefill's step still runs to its end: the next test must not queue behind it
    const t = performance.now();
    while (eng('p0').model().core.stepping && performance.now() - t < 10000) await new Promise((r) => setTimeout(r, 20));
  });

  it('does not abort a prefill that ends within the grace', async () => {
    eng('p0').setOptions({ sglangStreamAbortGraceMs: 200 });
    const ac = new AbortController();
    const d = post('d0', '/v1/completions', room('short', ',"stream":true'));
    await post('p0', '/v1/completions', room('short', ',"stream":true'), {}, ac.signal);
    ac.abort();
    const body = await (await d).text();
    expect(body).not.toMatch(/KVTransferError/);
    expect(eng('p0').stats().sglangAborts).toBe(0);
  });
});

describe('health', () => {
  it('runs a generation behind the prefill queue when healthGenerate is on (SGLang), answers at once when off', async () => {
    // Order, not time bounds (a busy machine delays any answer): a 3 s prefill is running; /health
    // answers while it runs when healthGenerate is off, and only once it is done when on
    eng('p0').setOptions({ timeScale: 1, prefillMsPerToken: 1 });
    const busy = post('p0', '/v1/completions', { model: 'sim-model', prompt: 'y'.repeat(12000), max_tokens: 1 }); // 3,000 tokens: 3 s
    for (let i = 0; i < 200 && eng('p0').stats().inflight === 0; i++) await new Promise((r) => setTimeout(r, 10));
    expect((await fetch(eng('p0').url + '/health')).status).toBe(200);
    expect(eng('p0').stats().inflight).toBe(1);
    eng('p0').setOptions({ healthGenerate: true });
    expect((await fetch(eng('p0').url + '/health')).status).toBe(200);
    expect(eng('p0').stats().healthGenerations).toBe(1);
    // its one-token generation waited behind the prefill: that request is answered and gone
    expect(eng('p0').stats().inflight).toBe(0);
    expect((await busy).status).toBe(200);
  });
});

describe('request ids', () => {
  it('refuses a second in-flight request with the same x-request-id on one engine', async () => {
    eng('d0').setOptions({ timeScale: 1 });
    const first = post('d0', '/v1/completions', { model: 'sim-model', prompt: 'a', max_tokens: 10 }, { 'x-request-id': 'dup' });
    await new Promise((r) => setTimeout(r, 20));
    const second = await post('d0', '/v1/completions', { model: 'sim-model', prompt: 'b', max_tokens: 1 }, { 'x-request-id': 'dup' });
    expect(second.status).toBe(400);
    expect((await second.json()).error.message).toMatch(/already running/);
    expect((await first).status).toBe(200);
    expect(eng('d0').stats().duplicateRequestIds).toBe(1);
  });
});

describe('control server', () => {
  it('sets tunable options on one engine or all and rejects unknown ones', async () => {
    const ok = await fetch(`${cluster.controlUrl}/engines/p0/options`, { method: 'POST', body: JSON.stringify({ kvHoldTimeoutMs: 1000 }) });
    expect(ok.status).toBe(200);
    expect((await fetch(`${cluster.controlUrl}/options`, { method: 'POST', body: JSON.stringify({ bogus: 1 }) })).status).toBe(400);
    const info = await (await fetch(`${cluster.controlUrl}/engines/p0/options`)).json();
    expect(info.mooncakeEngineId).toBe(eng('p0').mooncakeEngineId);
  });
});
