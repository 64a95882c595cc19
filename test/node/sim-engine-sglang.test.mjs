import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { startSimCluster } from '../../sim/cluster.mjs';

const MAX_ROOM = '9223372036854775807'; // 2^63-1: not representable as a JS number
const prompt = 'y'.repeat(2048 * 2 + 10); // 2 full blocks + a partial one

let cluster;
const eng = (id) => cluster.engines.get(id);
/** A raw body written by hand, so the room goes out as a bare 63-bit JSON integer. */
const rawBody = (room, port, extra = '') =>
  `{"model":"sim-model","prompt":"${prompt}","max_tokens":3${extra},"bootstrap_host":"127.0.0.1","bootstrap_port":${port},"bootstrap_room":${room}}`;
const post = (id, body) => fetch(eng(id).url + '/v1/completions', { method: 'POST', headers: { 'content-type': 'application/json' }, body });

beforeAll(async () => {
  cluster = await startSimCluster({
    engines: [
      { id: 'p0', role: 'prefill', timeScale: 1 },
      { id: 'd0', role: 'decode', bootstrapTimeoutMs: 300 },
      { id: 'c0', role: 'both' },
    ],
    defaults: { timeScale: 0 },
  });
});
afterAll(() => cluster?.close());
beforeEach(() => fetch(cluster.controlUrl + '/reset', { method: 'POST' }));

describe('sglang legs', () => {
  it('keeps a 2^63-1 room exact and records that it was a bare integer', async () => {
    const p = eng('p0');
    const [pRes, dRes] = await Promise.all([post('p0', rawBody(MAX_ROOM, p.bootstrapPort)), post('d0', rawBody(MAX_ROOM, p.bootstrapPort))]);
    expect(pRes.status).toBe(200);
    expect(dRes.status).toBe(200);
    for (const id of ['p0', 'd0']) {
      const [entry] = eng(id).requests();
      expect(entry.bootstrapRoom).toBe(MAX_ROOM);
      expect(entry.bootstrapRoomBareInteger).toBe(true);
    }
  });

  it('notes a room written as a string', async () => {
    await Promise.all([post('p0', rawBody('"42"', eng('p0').port)), post('d0', rawBody('"42"', eng('p0').port))]);
    expect(eng('d0').requests()[0]).toMatchObject({ bootstrapRoom: '42', bootstrapRoomBareInteger: false });
  });

  it('D waits for the prefill of its room, then pulls the blocks and decodes', async () => {
    const port = eng('p0').port;
    const started = Date.now();
    const dPending = post('d0', rawBody('123456789012345678', port));
    await new Promise((r) => setTimeout(r, 100));
    expect(eng('d0').stats().inflight).toBe(1); // still waiting: no prefill yet
    const pRes = await post('p0', rawBody('123456789012345678', port));
    expect(pRes.status).toBe(200);
    const dRes = await dPending;
    expect(dRes.status).toBe(200);
    expect(Date.now() - started).toBeGreaterThanOrEqual(100);
    const dJson = await dRes.json();
    expect(dJson.usage.completion_tokens).toBe(3);
    const d = eng('d0').stats();
    expect(d.requests.sglangDecode).toBe(1);
    expect(d.fullRepulls).toBe(1);
    expect(d.blocksPulled).toBe(3);
    // simulated TTFT includes P's prefill (1027 tokens * 0.05) + the transfer (5 ms a 512 tokens) + D's first step
    expect(d.ttftMs[0]).toBeGreaterThanOrEqual(1027 * 0.05 + (1027 / 512) * 5 + 15);
    const p = eng('p0').stats();
    expect(p.requests.sglangPrefill).toBe(1);
    expect(p.protocolViolations).toBe(0);
  });

  it('gives up with 504 when no prefill arrives', async () => {
    const res = await post('d0', rawBody('7', eng('p0').port));
    expect(res.status).toBe(504);
    expect((await res.json()).error.message).toMatch(/room 7/);
  });

  it('fails the decode leg when the room was prefilled elsewhere', async () => {
    const [, dRes] = await Promise.all([post('p0', rawBody('8', eng('p0').port)), post('d0', rawBody('8', 1))]);
    expect(dRes.status).toBe(502);
    expect(eng('d0').stats().protocolViolations).toBe(1);
  });

  it('a `both` engine named as bootstrap takes the prefill leg first, then the decode leg', async () => {
    const port = eng('c0').bootstrapPort;
    const [a, b] = await Promise.all([post('c0', rawBody('99', port)), post('c0', rawBody('99', port))]);
    expect([a.status, b.status]).toEqual([200, 200]);
    expect(eng('c0').stats().requests).toMatchObject({ sglangPrefill: 1, sglangDecode: 1 });
  });

  it('a `both` engine not named as bootstrap takes the decode leg', async () => {
    const port = eng('p0').port;
    const [, c] = await Promise.all([post('p0', rawBody('100', port)), post('c0', rawBody('100', port))]);
    expect(c.status).toBe(200);
    expect(eng('c0').stats().requests).toMatchObject({ sglangPrefill: 0, sglangDecode: 1 });
  });
});
