import { EventSourceParserStream } from 'eventsource-parser/stream';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { startSimCluster } from '../../sim/cluster.mjs';
import { simDetokenize, simTokenize } from '../../sim/endpoints.mjs';

const MAX_ROOM = '9223372036854775807'; // 2^63-1: not representable as a JS number
const TRACEPARENT = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';

let cluster;
const eng = (id) => cluster.engines.get(id);
const post = (id, path, body, headers = {}) =>
  fetch(eng(id).url + path, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: typeof body === 'string' ? body : JSON.stringify(body) });

/** SSE events of a response: { event, data } with data parsed when it is JSON. */
async function sseEvents(res) {
  const events = [];
  const reader = res.body.pipeThrough(new TextDecoderStream()).pipeThrough(new EventSourceParserStream()).getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return events;
    events.push({ event: value.event, data: value.data === '[DONE]' ? value.data : JSON.parse(value.data) });
  }
}

const until = async (check, ms = 3000) => {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (check()) return;
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error('condition not reached');
};

beforeAll(async () => {
  cluster = await startSimCluster({
    engines: [
      { id: 'p0', role: 'prefill' },
      { id: 'd0', role: 'decode', bootstrapTimeoutMs: 2000 },
      { id: 'c0', role: 'both' },
      // slow enough to abort mid-stream (20 ms a token)
      { id: 'slow', role: 'both', timeScale: 1, decodeBaseMs: 20 },
    ],
    defaults: { timeScale: 0 },
  });
});
afterAll(() => cluster?.close());
beforeEach(() => fetch(cluster.controlUrl + '/reset', { method: 'POST' }));

describe('POST /v1/responses (vLLM shapes)', () => {
  it('answers a response object with output_text, usage and the incomplete status of a spent budget', async () => {
    const res = await post(
      'c0',
      '/v1/responses',
      { model: 'sim-model', instructions: 'Be brief.', input: 'Hello there', max_output_tokens: 4 },
      { traceparent: TRACEPARENT, 'x-request-id': 'r-1' },
    );
    expect(res.status).toBe(200);
    const body = await res.json();
    expect(body).toMatchObject({
      object: 'response',
      model: 'sim-model',
      status: 'incomplete',
      incomplete_details: { reason: 'max_output_tokens' },
      instructions: 'Be brief.',
      max_output_tokens: 4,
      kv_transfer_params: null,
      output: [{ type: 'message', role: 'assistant', status: 'completed', content: [{ type: 'output_text', annotations: [] }] }],
      usage: { output_tokens: 4, input_tokens_details: { cached_tokens: 0 }, output_tokens_details: { reasoning_tokens: 0 } },
    });
    expect(body.id).toMatch(/^resp_/);
    expect(body.output[0].id).toMatch(/^msg_/);
    expect(body.output[0].content[0].text.split(' ')).toHaveLength(4);
    expect(body.usage.total_tokens).toBe(body.usage.input_tokens + 4);
    // recorded like a completion request, headers included
    const [entry] = eng('c0').requests();
    expect(entry).toMatchObject({ path: '/v1/responses', headers: { traceparent: TRACEPARENT, 'x-request-id': 'r-1' } });
    expect(JSON.parse(entry.body).input).toBe('Hello there');
    expect(eng('c0').stats().requests.colocated).toBe(1);
  });

  it('streams the typed events, created ... output_text.delta ... completed with usage, numbered from 0', async () => {
    const res = await post('c0', '/v1/responses', {
      model: 'sim-model',
      input: [{ role: 'user', content: [{ type: 'input_text', text: 'Count to three' }] }],
      max_output_tokens: 3,
      stream: true,
    });
    expect(res.headers.get('content-type')).toBe('text/event-stream');
    const events = await sseEvents(res);
    expect(events.map((e) => e.event)).toEqual([
      'response.created',
      'response.in_progress',
      'response.output_item.added',
      'response.content_part.added',
      'response.output_text.delta',
      'response.output_text.delta',
      'response.output_text.delta',
      'response.output_text.done',
      'response.content_part.done',
      'response.output_item.done',
      'response.completed',
    ]);
    // the SSE event name and the JSON type agree; no [DONE] sentinel (vLLM sends none)
    for (const [i, e] of events.entries()) expect(e.data).toMatchObject({ type: e.event, sequence_number: i });
    expect(events[0].data.response).toMatchObject({ status: 'in_progress', output: [], usage: null });
    const deltas = events
      .filter((e) => e.event === 'response.output_text.delta')
      .map((e) => e.data.delta)
      .join('');
    expect(events.at(-4).data.text).toBe(deltas);
    const done = events.at(-1).data.response;
    expect(done).toMatchObject({ status: 'incomplete', usage: { output_tokens: 3 }, output: [{ content: [{ text: deltas }] }] });
    expect(done.id).toBe(events[0].data.response.id);
  });

  it('P leg (max_output_tokens 1, kv_transfer_params do_remote_decode) hands back a handle; D pulls it and counts it as cached', async () => {
    const input = 'x'.repeat(4096 - 'user: '.length); // 1024 tokens at 4 characters a token
    const pRes = await post('p0', '/v1/responses', {
      model: 'sim-model',
      input,
      max_output_tokens: 1,
      stream: false,
      kv_transfer_params: { do_remote_decode: true, do_remote_prefill: false, remote_engine_id: null, remote_block_ids: null, remote_host: null, remote_port: null },
    });
    const p = await pRes.json();
    expect(p.usage.output_tokens).toBe(1);
    expect(p.kv_transfer_params).toMatchObject({ do_remote_prefill: true, do_remote_decode: false, remote_engine_id: 'p0', remote_host: '127.0.0.1', remote_port: eng('p0').port });
    expect(p.kv_transfer_params.remote_block_ids).toHaveLength(2); // 1024 tokens, 512-token blocks

    const events = await sseEvents(await post('d0', '/v1/responses', { model: 'sim-model', input, max_output_tokens: 5, stream: true, kv_transfer_params: p.kv_transfer_params }));
    const usage = events.at(-1).data.response.usage;
    expect(usage).toMatchObject({ input_tokens: 1024, output_tokens: 5, input_tokens_details: { cached_tokens: 1024 } });
    expect(eng('p0').stats()).toMatchObject({ requests: { vllmPrefill: 1 }, protocolViolations: 0 });
    expect(eng('d0').stats()).toMatchObject({ requests: { vllmDecode: 1 }, protocolViolations: 0 });
  });

  it('notes a P leg that streams or asks for more than one token', async () => {
    const res = await post('p0', '/v1/responses', { model: 'sim-model', input: 'hi', max_output_tokens: 8, stream: true, kv_transfer_params: { do_remote_decode: true } });
    await res.arrayBuffer();
    expect(eng('p0').stats().violations).toEqual(['vllm responses prefill leg has stream:true', 'vllm responses prefill leg has max_output_tokens:8']);
  });

  it('rejects what vLLM rejects: no input, an unknown model', async () => {
    const noInput = await post('c0', '/v1/responses', { model: 'sim-model' });
    expect(noInput.status).toBe(400);
    expect((await noInput.json()).error).toMatchObject({ type: 'invalid_request_error', param: 'input' });
    const unknown = await post('c0', '/v1/responses', { model: 'other', input: 'x' });
    expect(unknown.status).toBe(404);
  });

  it('honours injected faults like the chat path', async () => {
    await fetch(`${cluster.controlUrl}/engines/c0/fault`, { method: 'POST', body: JSON.stringify({ mode: 'status500', count: 1 }) });
    expect((await post('c0', '/v1/responses', { input: 'x' })).status).toBe(500);
    expect((await post('c0', '/v1/responses', { input: 'x' })).status).toBe(200);
    await fetch(`${cluster.controlUrl}/engines/c0/fault`, { method: 'POST', body: JSON.stringify({ mode: 'midstream', afterChunks: 5, count: 1 }) });
    const broken = await post('c0', '/v1/responses', { input: 'x', max_output_tokens: 8, stream: true });
    await expect(sseEvents(broken)).rejects.toThrow();
    expect(eng('c0').stats().faultsInjected).toBe(2);
  });

  it('counts a client that leaves mid-stream as an abort and stops generating', async () => {
    const ac = new AbortController();
    const res = await fetch(eng('slow').url + '/v1/responses', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ input: 'x', max_output_tokens: 200, stream: true }),
      signal: ac.signal,
    });
    const reader = res.body.getReader();
    await reader.read();
    ac.abort();
    await until(() => eng('slow').stats().clientAborts === 1);
    await until(() => eng('slow').stats().inflight === 0);
    const produced = eng('slow').stats().outputTokens;
    await new Promise((r) => setTimeout(r, 100));
    expect(eng('slow').stats().outputTokens).toBe(produced);
    expect(produced).toBeLessThan(200);
  });
});

describe('POST /v1/embeddings, /tokenize, /detokenize (vLLM shapes)', () => {
  it('embeds strings into deterministic unit vectors with usage', async () => {
    const res = await post('c0', '/v1/embeddings', { model: 'sim-model', input: ['alpha', 'beta', 'alpha'] }, { traceparent: TRACEPARENT });
    const body = await res.json();
    expect(body).toMatchObject({
      object: 'list',
      model: 'sim-model',
      data: [{ object: 'embedding', index: 0 }, { index: 1 }, { index: 2 }],
      usage: { prompt_tokens: 6, total_tokens: 6 },
    });
    expect(body.id).toMatch(/^embd-/);
    expect(body.data[0].embedding).toEqual(body.data[2].embedding);
    expect(body.data[0].embedding).not.toEqual(body.data[1].embedding);
    expect(Math.hypot(...body.data[0].embedding)).toBeCloseTo(1, 6);
    expect(eng('c0').requests()[0]).toMatchObject({ path: '/v1/embeddings', headers: { traceparent: TRACEPARENT } });
  });

  it('honours dimensions and base64 encoding', async () => {
    const body = await (await post('c0', '/v1/embeddings', { input: 'alpha', dimensions: 4, encoding_format: 'base64' })).json();
    const floats = new Float32Array(Uint8Array.from(Buffer.from(body.data[0].embedding, 'base64')).buffer);
    expect(floats).toHaveLength(4);
    expect((await post('c0', '/v1/embeddings', { input: 42 })).status).toBe(400);
  });

  it('tokenize and detokenize invert each other, for a prompt and for chat messages', async () => {
    const text = 'Hello, wörld — P/D!';
    const tok = await (await post('c0', '/tokenize', { model: 'sim-model', prompt: text })).json();
    expect(tok).toMatchObject({ count: tok.tokens.length, max_model_len: 131072, token_strs: null });
    expect(tok.tokens).toEqual(simTokenize(text));
    const detok = await (await post('c0', '/detokenize', { model: 'sim-model', tokens: tok.tokens })).json();
    expect(detok).toEqual({ prompt: text });
    const chat = await (await post('c0', '/tokenize', { model: 'sim-model', messages: [{ role: 'user', content: 'hi' }] })).json();
    expect(simDetokenize(chat.tokens)).toBe('user: hi');
    expect((await post('c0', '/detokenize', { tokens: [7] })).status).toBe(400);
    expect(
      eng('c0')
        .requests()
        .map((e) => e.path),
    ).toEqual(['/tokenize', '/detokenize', '/tokenize', '/detokenize']);
  });
});

describe("POST /generate (SGLang's native API)", () => {
  const bootstrap = (room) => `"bootstrap_host":"127.0.0.1","bootstrap_port":${eng('p0').bootstrapPort},"bootstrap_room":${room}`;

  it('colocated: text in, text and meta_info out; input_ids too', async () => {
    const out = await (await post('c0', '/generate', { text: 'Once upon a time', sampling_params: { max_new_tokens: 3, temperature: 0 } })).json();
    expect(out.text.split(' ')).toHaveLength(3);
    expect(out.meta_info).toMatchObject({ finish_reason: { type: 'length', length: 3 }, prompt_tokens: 4, completion_tokens: 3, cached_tokens: 0 });
    const ids = await (await post('c0', '/generate', { input_ids: [1, 2, 3], sampling_params: { max_new_tokens: 2 } })).json();
    expect(ids.meta_info.completion_tokens).toBe(2);
    expect((await post('c0', '/generate', { sampling_params: {} })).status).toBe(400);
  });

  it('streams cumulative text, then [DONE]', async () => {
    const events = await sseEvents(await post('c0', '/generate', { text: 'abc', sampling_params: { max_new_tokens: 3 }, stream: true }));
    expect(events.at(-1).data).toBe('[DONE]');
    const chunks = events.slice(0, -1).map((e) => e.data);
    expect(chunks).toHaveLength(3);
    expect(chunks[2].text.startsWith(chunks[1].text)).toBe(true);
    expect(chunks.map((c) => c.meta_info.finish_reason)).toEqual([null, null, { type: 'length', length: 3 }]);
  });

  it('P and D of one room meet; the 63-bit room stays exact; both see the trace headers', async () => {
    const body = `{"text":"${'y'.repeat(3000)}","sampling_params":{"max_new_tokens":4},"stream":true,${bootstrap(MAX_ROOM)}}`;
    const headers = { traceparent: TRACEPARENT };
    const [pRes, dRes] = await Promise.all([post('p0', '/generate', body, headers), post('d0', '/generate', body, headers)]);
    const [pEvents, dEvents] = await Promise.all([sseEvents(pRes), sseEvents(dRes)]);
    expect(pEvents.filter((e) => e.data !== '[DONE]')).toHaveLength(1); // P makes one token
    const last = dEvents.at(-2).data;
    expect(last.meta_info).toMatchObject({ completion_tokens: 4, prompt_tokens: 750, cached_tokens: 750 });
    for (const id of ['p0', 'd0']) {
      expect(eng(id).requests()[0]).toMatchObject({ path: '/generate', bootstrapRoom: MAX_ROOM, bootstrapRoomBareInteger: true, headers: { traceparent: TRACEPARENT } });
      expect(eng(id).stats().protocolViolations).toBe(0);
    }
    expect(eng('p0').stats().requests.sglangPrefill).toBe(1);
    expect(eng('d0').stats().requests.sglangDecode).toBe(1);
  });

  it('a batch carries the bootstrap fields as arrays, one room per prompt; D answers a list', async () => {
    const port = eng('p0').bootstrapPort;
    const body = `{"input_ids":[[1,2,3],[4,5,6,7]],"sampling_params":{"max_new_tokens":2},"bootstrap_host":["127.0.0.1","127.0.0.1"],"bootstrap_port":[${port},${port}],"bootstrap_room":[${MAX_ROOM},17]}`;
    const [pRes, dRes] = await Promise.all([post('p0', '/generate', body), post('d0', '/generate', body)]);
    expect(pRes.status).toBe(200);
    const d = await dRes.json();
    expect(d).toHaveLength(2);
    expect(d.map((o) => o.meta_info.completion_tokens)).toEqual([2, 2]);
    expect(eng('d0').requests()[0].bootstrapRooms).toEqual([MAX_ROOM, '17']);
  });

  it('rejects and notes a batch whose bootstrap fields are scalars', async () => {
    const res = await post('d0', '/generate', `{"text":["a","b"],${bootstrap(5)}}`);
    expect(res.status).toBe(400);
    expect(eng('d0').stats().violations[0]).toMatch(/batch of 2 has bootstrap_host as a scalar/);
  });

  it('a D leg whose prefill never comes gives up with 504, and notes a prefill on the wrong bootstrap port', async () => {
    const lonely = cluster.engines.get('d0');
    const res = await post('d0', '/generate', `{"text":"z",${bootstrap(99)}}`);
    expect(res.status).toBe(504);
    expect(lonely.stats().errors).toBe(1);
    await post('p0', '/generate', `{"text":"z","bootstrap_host":"127.0.0.1","bootstrap_port":1,"bootstrap_room":100}`);
    expect(eng('p0').stats().violations[0]).toMatch(/names bootstrap 127.0.0.1:1/);
  }, 10000);
});
