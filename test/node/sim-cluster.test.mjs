import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { startSimCluster } from '../../sim/cluster.mjs';

let cluster;
const control = (path, init) => fetch(cluster.controlUrl + path, init);
const postJson = (path, body) => control(path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: typeof body === 'string' ? body : JSON.stringify(body) });
const engineUrl = (id) => cluster.engines.get(id).url;
const complete = (id) => fetch(engineUrl(id) + '/v1/completions', { method: 'POST', body: JSON.stringify({ model: 'm1', prompt: 'hi', max_tokens: 2 }) });

beforeAll(async () => {
  cluster = await startSimCluster({
    engines: [
      { id: 'p0', role: 'prefill' },
      { id: 'd0', role: 'decode', models: ['m1', 'm2'] },
    ],
    defaults: { timeScale: 0, models: ['m1'] },
  });
});
afterAll(() => cluster?.close());
beforeEach(() => postJson('/reset', ''));

describe('sim cluster control server', () => {
  it('lists engines', async () => {
    const list = await (await control('/engines')).json();
    expect(list).toEqual([
      { id: 'p0', role: 'prefill', url: engineUrl('p0'), running: true },
      { id: 'd0', role: 'decode', url: engineUrl('d0'), running: true },
    ]);
  });

  it('applies defaults, each engine overriding them', async () => {
    const models = async (id) => (await (await fetch(engineUrl(id) + '/v1/models')).json()).data.map((m) => m.id);
    expect(await models('p0')).toEqual(['m1']);
    expect(await models('d0')).toEqual(['m1', 'm2']);
  });

  it('serves stats per engine and for all, and the request log', async () => {
    await complete('d0');
    const one = await (await control('/engines/d0/stats')).json();
    expect(one).toMatchObject({ id: 'd0', role: 'decode', requests: { total: 1 }, selfPrefills: 1, inflight: 0 });
    const all = await (await control('/stats')).json();
    expect(Object.keys(all)).toEqual(['p0', 'd0']);
    expect(all.d0.outputTokens).toBe(2);
    const log = await (await control('/engines/d0/requests')).json();
    expect(log).toHaveLength(1);
    expect(JSON.parse(log[0].body).prompt).toBe('hi');
  });

  it('injects faults and validates them', async () => {
    expect((await postJson('/engines/d0/fault', { mode: 'status500', count: 1 })).status).toBe(200);
    expect((await complete('d0')).status).toBe(500);
    expect((await complete('d0')).status).toBe(200);
    expect((await postJson('/engines/d0/fault', { mode: 'explode' })).status).toBe(400);
    expect((await postJson('/engines/d0/fault', '{nope')).status).toBe(400);
    expect((await postJson('/engines/d0/fault', { health: false })).status).toBe(200);
    expect((await fetch(engineUrl('d0') + '/health')).status).toBe(503);
  });

  it('stops and starts engines; /reset restarts the stopped ones and clears state', async () => {
    await complete('d0');
    expect((await postJson('/engines/d0/stop', '')).status).toBe(200);
    await expect(complete('d0')).rejects.toThrow();
    expect((await (await control('/engines')).json())[1].running).toBe(false);
    expect((await postJson('/engines/d0/start', '')).status).toBe(200);
    expect((await complete('d0')).status).toBe(200);
    await postJson('/engines/d0/stop', '');
    await postJson('/engines/d0/fault', { mode: 'status400' });
    expect((await postJson('/reset', '')).status).toBe(200);
    expect((await complete('d0')).status).toBe(200);
    const stats = await (await control('/engines/d0/stats')).json();
    expect(stats.requests.total).toBe(1);
    expect(stats.cacheBlocksUsed).toBe(0);
  });

  it('answers unknown engines and routes with 4xx JSON', async () => {
    const a = await control('/engines/zz/stats');
    expect(a.status).toBe(404);
    expect((await a.json()).error.message).toMatch(/zz/);
    expect((await control('/nope')).status).toBe(404);
    expect((await control('/engines/d0/stop')).status).toBe(405);
  });

  it('serves the same stats on the engine itself, and resets it', async () => {
    await complete('d0');
    expect((await (await fetch(engineUrl('d0') + '/_sim/stats')).json()).requests.total).toBe(1);
    await fetch(engineUrl('d0') + '/_sim/reset', { method: 'POST' });
    expect((await (await fetch(engineUrl('d0') + '/_sim/stats')).json()).requests.total).toBe(0);
  });
});
