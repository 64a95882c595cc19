import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { startEngine } from '../../sim/engine.mjs';

let engine;
const body = (extra = {}) => JSON.stringify({ model: 'sim-model', prompt: 'hello there', max_tokens: 6, ...extra });
const post = (extra, init = {}) => fetch(engine.url + '/v1/completions', { method: 'POST', headers: { 'content-type': 'application/json' }, body: body(extra), ...init });
const until = async (check, ms = 2000) => {
  const end = Date.now() + ms;
  while (!check()) {
    if (Date.now() > end) throw new Error('condition not met in time');
    await new Promise((r) => setTimeout(r, 10));
  }
};
/** Read a response body to the end, noting when each read arrived. */
async function readAll(res) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  const reads = [];
  let text = '';
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    reads.push(performance.now());
    text += decoder.decode(value, { stream: true });
  }
  return { text, reads };
}
const events = (text) =>
  text
    .split('\n\n')
    .filter((e) => e.startsWith('data: '))
    .map((e) => e.slice(6));

beforeAll(async () => {
  engine = await startEngine({ id: 'e0', role: 'both', timeScale: 0 });
});
afterAll(() => engine?.close());
beforeEach(() => engine.reset());

describe('streaming', () => {
  it('writes one SSE event per token over time, then usage and [DONE]', async () => {
    const slow = await startEngine({ id: 'slow', role: 'both', timeScale: 1 }); // 16 ms a token
    try {
      const sent = performance.now();
      const res = await fetch(slow.url + '/v1/chat/completions', {
        method: 'POST',
        body: JSON.stringify({ model: 'sim-model', stream: true, max_tokens: 6, stream_options: { include_usage: true }, messages: [{ role: 'user', content: 'hi' }] }),
      });
      expect(res.headers.get('content-type')).toBe('text/event-stream');
      const { text, reads } = await readAll(res);
      // streamed, not one buffered body; and paced: an event fires at its simulated time or late
      // (a busy event loop), never early, so the last one comes at least five tokens' time after
      // the request was sent. (Time between reads is no measure: late events catch up together.)
      expect(reads.length).toBeGreaterThanOrEqual(2);
      expect(reads.at(-1) - sent).toBeGreaterThanOrEqual(5 * 16);
      const ev = events(text);
      expect(ev.at(-1)).toBe('[DONE]');
      const chunks = ev.slice(0, -1).map((e) => JSON.parse(e));
      expect(chunks).toHaveLength(7);
      expect(chunks[0].object).toBe('chat.completion.chunk');
      expect(chunks[0].choices[0].delta.role).toBe('assistant');
      expect(chunks[1].choices[0].delta).not.toHaveProperty('role');
      expect(chunks[5].choices[0].finish_reason).toBe('length');
      expect(chunks[4].choices[0].finish_reason).toBe(null);
      expect(chunks[6].choices).toEqual([]);
      expect(chunks[6].usage).toMatchObject({ completion_tokens: 6 });
      expect(chunks[6].usage.prompt_tokens_details).toBeUndefined();
      const s = slow.stats();
      expect(s.itlMs).toHaveLength(5);
      // a one-sequence decode step: the weights read (15 ms) + 1 ms for the sequence + its tiny context
      for (const x of s.itlMs) expect(x).toBeCloseTo(16, 2);
      expect(s.tpotMs[0]).toBeCloseTo(16, 2);
    } finally {
      await slow.close();
    }
  });

  it('streams completions without a usage chunk unless asked', async () => {
    const { text } = await readAll(await post({ stream: true, max_tokens: 3 }));
    const ev = events(text);
    expect(ev).toHaveLength(4);
    expect(JSON.parse(ev[0])).toMatchObject({ object: 'text_completion', choices: [{ text: expect.any(String) }] });
  });
});

describe('faults', () => {
  it('status500 and status400 answer OpenAI errors for `count` requests', async () => {
    engine.setFault({ mode: 'status500', count: 1 });
    const a = await post();
    expect(a.status).toBe(500);
    expect((await a.json()).error).toMatchObject({ message: expect.any(String), type: 'server_error' });
    expect((await post()).status).toBe(200);
    engine.setFault({ mode: 'status400' });
    expect((await post()).status).toBe(400);
    expect((await post()).status).toBe(400);
    engine.setFault({ mode: 'none' });
    expect((await post()).status).toBe(200);
    expect(engine.stats().faultsInjected).toBe(3);
  });

  it('hang never answers; the client giving up counts as an abort', async () => {
    engine.setFault({ mode: 'hang' });
    await expect(post({}, { signal: AbortSignal.timeout(150) })).rejects.toThrow();
    await until(() => engine.stats().clientAborts === 1 && engine.stats().inflight === 0);
    expect(engine.requests()).toHaveLength(1);
  });

  it('reset destroys the connection without an answer', async () => {
    engine.setFault({ mode: 'reset', count: 1 });
    await expect(post()).rejects.toThrow();
    expect((await post()).status).toBe(200);
    expect(engine.stats().clientAborts).toBe(0);
  });

  it('midstream sends afterChunks chunks, then cuts the stream', async () => {
    engine.setFault({ mode: 'midstream', afterChunks: 2 });
    const res = await post({ stream: true, max_tokens: 10 });
    expect(res.status).toBe(200);
    const reader = res.body.getReader();
    let text = '';
    await expect(
      (async () => {
        for (;;) {
          const { done, value } = await reader.read();
          if (done) return;
          text += new TextDecoder().decode(value);
        }
      })(),
    ).rejects.toThrow();
    expect(events(text)).toHaveLength(2);
    expect(text).not.toContain('[DONE]');
  });

  it('midstream on a non-stream answer sends half a body', async () => {
    engine.setFault({ mode: 'midstream' });
    const res = await post();
    await expect(res.text()).rejects.toThrow();
  });

  it('slow delays the response headers', async () => {
    engine.setFault({ mode: 'slow', delayMs: 250 });
    const t = Date.now();
    const res = await post();
    expect(res.status).toBe(200);
    expect(Date.now() - t).toBeGreaterThanOrEqual(240);
  });

  it('health:false makes /health answer 503', async () => {
    engine.setFault({ health: false });
    expect((await fetch(engine.url + '/health')).status).toBe(503);
    expect((await post()).status).toBe(200);
    engine.reset();
    expect((await fetch(engine.url + '/health')).status).toBe(200);
  });

  it('counts a client leaving in the middle of a stream', async () => {
    const slow = await startEngine({ id: 'slow2', role: 'both', timeScale: 1 });
    try {
      const ac = new AbortController();
      const res = await fetch(slow.url + '/v1/completions', { method: 'POST', body: body({ stream: true, max_tokens: 50 }), signal: ac.signal });
      await res.body.getReader().read();
      expect(slow.stats().inflight).toBe(1);
      ac.abort();
      await until(() => slow.stats().clientAborts === 1 && slow.stats().inflight === 0);
      expect(slow.stats().outputTokens).toBeLessThan(50);
    } finally {
      await slow.close();
    }
  });
});

describe('stop and start', () => {
  it('refuses connections while stopped and serves again on the same port', async () => {
    const port = engine.port;
    await engine.stop();
    await expect(fetch(engine.url + '/health')).rejects.toThrow();
    await engine.start();
    expect(engine.port).toBe(port);
    expect((await fetch(engine.url + '/health')).status).toBe(200);
  });

  it('stop cuts the requests in flight', async () => {
    engine.setFault({ mode: 'hang' });
    const pending = post();
    await until(() => engine.stats().inflight === 1);
    await engine.stop();
    await expect(pending).rejects.toThrow();
    await engine.start();
  });
});
