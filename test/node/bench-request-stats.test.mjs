import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startSimCluster } from '../../sim/cluster.mjs';
import { vllmPrefillBody } from '../../bench/scenarios/overhead.mjs';

let cluster;
const post = (url, body, id) => fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', 'x-request-id': id }, body: JSON.stringify(body) });
const url = (id) => cluster.engines.get(id).url + '/v1/completions';

beforeAll(async () => {
  cluster = await startSimCluster({
    engines: [
      { id: 'p0', role: 'prefill' },
      { id: 'p1', role: 'prefill' },
      { id: 'd0', role: 'decode' },
    ],
    defaults: { timeScale: 0 },
  });
});
afterAll(() => cluster?.close());

/** two vllm legs, as a router would send them */
async function twoLegs(p, prompt, id) {
  const body = { model: 'sim-model', prompt, max_tokens: 2 };
  const pr = await (await post(url(p), vllmPrefillBody(body), id)).json();
  await (await post(url('d0'), { ...body, kv_transfer_params: pr.kv_transfer_params }, id)).text();
}

describe('per-request figures keyed by x-request-id (GET /request-stats)', () => {
  it('records both legs of a request, locality misses and the P a decode leg pulled from', async () => {
    const turn1 = 'a'.repeat(2048 * 3);
    await twoLegs('p0', turn1, 'conv0-turn1');
    // turn 2 goes to the other P: the 3 blocks p0 holds are locality misses on p1
    await twoLegs('p1', turn1 + 'b'.repeat(2048), 'conv0-turn2');
    const all = await (await fetch(cluster.controlUrl + '/request-stats')).json();
    expect(all['conv0-turn1'].p0).toMatchObject({ leg: 'vllmPrefill', blocks: 3, blocksHit: 0, localityMissBlocks: 0 });
    expect(all['conv0-turn1'].d0).toMatchObject({ leg: 'vllmDecode', blocksHit: 0, blocksPulled: 3, fullRepull: true, remoteEngineId: 'p0' });
    expect(all['conv0-turn2'].p1).toMatchObject({ leg: 'vllmPrefill', blocks: 4, blocksHit: 0, localityMissBlocks: 3 });
    expect(all['conv0-turn2'].d0).toMatchObject({ leg: 'vllmDecode', blocksHit: 3, blocksPulled: 1, fullRepull: false, remoteEngineId: 'p1', localityMissBlocks: 0 });
    const one = await (await fetch(cluster.engines.get('p1').url + '/_sim/request-stats')).json();
    expect(Object.keys(one)).toEqual(['conv0-turn2']);
    await fetch(cluster.controlUrl + '/reset', { method: 'POST' });
    expect(await (await fetch(cluster.controlUrl + '/request-stats')).json()).toEqual({});
  });
});
