import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { agenticConfigs, hideEngineSignals } from '../../bench/scenarios/agentic.mjs';
import { startSimCluster } from '../../sim/cluster.mjs';

// Await vs fire-and-forget dispatch (issue 22): the study ran its PD rows in await mode (prefill
// answered, then decode: the router's `vllm` protocol) and measured fire-and-forget (both legs at
// once: `vllm-mooncake`) as an ablation. What the dispatch changes on the engines: a
// fire-and-forget decode node takes the prompt's KV blocks when the request arrives, before the
// prefill even started; an awaited one takes none until P answered.

describe('the agentic configurations dispatch as the study did', () => {
  it('every PD row of the study awaits P; the fire-and-forget row is the ablation', () => {
    const rows = Object.fromEntries(agenticConfigs().map((c) => [c.name, c]));
    expect(rows['pd-4p4d/cache_aware'].protocol).toBe('vllm');
    expect(rows['pd-6p2d/cache_aware'].protocol).toBe('vllm');
    expect(rows['pd-6p2d/fire-and-forget']).toMatchObject({ protocol: 'vllm-mooncake', nodes: { prefill: 6, decode: 2 }, enabled: false });
  });

  it("the study's rows decide as its scheduler, reading no engine signals; the router's own policies read them", () => {
    const study = ['colocated-8/round_robin', 'colocated-8/cache_aware', 'pd-4p4d/cache_aware', 'pd-6p2d/cache_aware', 'pd-6p2d/fire-and-forget'];
    for (const c of agenticConfigs()) {
      if (study.includes(c.name)) expect(c.engineSignals, c.name).toBe(false);
      else expect(c.engineSignals, c.name).toBeUndefined();
    }
  });
});

describe('what the dispatch does to a decode node’s KV memory', () => {
  /** @type {Awaited<ReturnType<typeof startSimCluster>>} */
  let cluster;
  beforeAll(async () => {
    cluster = await startSimCluster({
      engines: [
        { id: 'p0', role: 'prefill' },
        { id: 'd0', role: 'decode' },
      ],
      defaults: { timeScale: 0.05 },
    });
  });
  afterAll(async () => cluster?.close());
  const eng = (id) => /** @type {any} */ (cluster.engines.get(id));
  const post = (id, body, rid) =>
    fetch(`${eng(id).url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-request-id': rid }, body: JSON.stringify(body) });
  const prompt = (tag) => `${tag} `.repeat(20000);
  const until = async (f) => {
    for (let i = 0; i < 500 && !f(); i++) await new Promise((r) => setTimeout(r, 10));
  };

  it('fire-and-forget: the decode node holds the prompt’s blocks before P has even started', async () => {
    const body = { model: 'sim-model', prompt: prompt('ff'), max_tokens: 2 };
    const d = post(
      'd0',
      {
        ...body,
        kv_transfer_params: {
          do_remote_decode: false,
          do_remote_prefill: true,
          remote_bootstrap_addr: `http://127.0.0.1:${eng('p0').bootstrapPort}`,
          remote_engine_id: eng('p0').mooncakeEngineId,
          transfer_id: 'ff-1',
        },
      },
      'ff',
    );
    await until(() => eng('d0').stats().kvUsage > 0);
    // P has not been sent anything yet, and D already holds the prompt's KV
    expect(eng('p0').stats().requests.total).toBe(0);
    expect(eng('d0').stats().kvUsage).toBeGreaterThan(0);
    const p = await post('p0', { ...body, max_tokens: 1, kv_transfer_params: { do_remote_decode: true, do_remote_prefill: false, transfer_id: 'ff-1' } }, 'ff');
    expect(p.status).toBe(200);
    expect((await d).status).toBe(200);
  });

  it("hidden signals: the engines' /metrics answers 404 (the router fails open, as the study's scheduler that read none), while the bench still reads their KV", async () => {
    const metrics = async () => (await fetch(`${eng('d0').url}/metrics`)).status;
    expect(await metrics()).toBe(200);
    hideEngineSignals({ cluster });
    expect(await metrics()).toBe(404);
    expect(await (await fetch(`${eng('p0').url}/metrics`)).text()).not.toContain('kv_cache_usage');
    expect(Number.isFinite(eng('d0').stats().kvUsage)).toBe(true);
    for (const e of cluster.engines.values()) /** @type {any} */ (e).setMetricsFault({ mode: 'none' });
    expect(await metrics()).toBe(200);
  });

  it('await: the decode node takes no blocks while P prefills, only once P answered', async () => {
    await fetch(`${eng('d0').url}/_sim/reset`, { method: 'POST' });
    const body = { model: 'sim-model', prompt: prompt('aw'), max_tokens: 2 };
    const p = post(
      'p0',
      {
        ...body,
        max_tokens: 1,
        stream: false,
        kv_transfer_params: { do_remote_decode: true, do_remote_prefill: false, remote_engine_id: null, remote_block_ids: null, remote_host: null, remote_port: null },
      },
      'aw',
    );
    await until(() => eng('p0').stats().requests.vllmPrefill > 0);
    expect(eng('d0').stats().kvUsagePeak).toBe(0);
    const answer = await (await p).json();
    expect(eng('d0').stats().kvUsagePeak).toBe(0);
    const d = await post('d0', { ...body, kv_transfer_params: answer.kv_transfer_params }, 'aw');
    expect(d.status).toBe(200);
    expect(eng('d0').stats().kvUsagePeak).toBeGreaterThan(0);
  });
});
