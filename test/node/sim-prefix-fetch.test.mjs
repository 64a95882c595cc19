import { describe, expect, it } from 'vitest';
import { SimClock } from '../../sim/model/clock.mjs';
import { Fabric } from '../../sim/model/fabric.mjs';
import { KvMemory } from '../../sim/model/kv-memory.mjs';
import { EngineCore, Sequence } from '../../sim/model/scheduler.mjs';
import { resolveModel } from '../../sim/presets.mjs';

// Seed 000's KV mesh (issue 22): a P fetches the prefix another engine holds, and the engine it
// fetches from pays for it (its step loop stalls while the bytes leave it), on a discrete-event
// clock so every figure is exact simulated time.

const hashes = (tag, n) => Array.from({ length: n }, (_, i) => `${tag}-${i}`);

/** Two engines, `p` and `d`, on one fabric; each step loop stalls for the KV moving in or out of it. */
function pair({ link = 100_000, stallLoadBytesPerMs = 200_000 } = {}) {
  const clock = new SimClock(0);
  const fabric = new Fabric(clock);
  const { cost } = resolveModel({ preset: 'default', cacheBlocks: 5000 });
  const core = (id) => {
    fabric.register(id, { linkBytesPerMs: link });
    const memory = new KvMemory({ numBlocks: 100000, blockSize: 16, unitTokens: 512 });
    const c = new EngineCore({
      clock,
      memory,
      cost,
      maxNumBatchedTokens: 8192,
      maxNumSeqs: 1024,
      preemption: true,
      stallLoadBytesPerMs,
      moved: (at) => fabric.stalling(id, at),
    });
    return { core: c, memory };
  };
  return { clock, fabric, p: core('p'), d: core('d') };
}

describe('P-side prefix fetch (seed 000 KV mesh)', () => {
  it('a P leg fetches the units another engine holds and prefills only the rest', async () => {
    const r = pair();
    const h = hashes('conv', 8);
    r.d.memory.insertReady(h.slice(0, 6)); // the decode node holds the first 6 units (3,072 tokens)
    const fetches = [];
    const seq = r.p.core.submit(
      new Sequence({
        kind: 'prefill',
        hashes: h,
        promptTokens: 8 * 512 + 100,
        maxTokens: 1,
        fetchPrefix: (local) => {
          const units = r.d.memory.lookup(h);
          return { units, run: () => (fetches.push(units - local), r.fabric.transfer('d', 'p', (units - local) * 512 * 1000)) };
        },
      }),
    );
    await seq.finished;
    expect(seq.state).toBe('finished');
    expect(fetches).toEqual([6]);
    expect(seq.fetchedUnits).toBe(6);
    // 8 x 512 + 100 tokens, 6 units fetched: 2 x 512 + 100 computed here
    expect(r.p.core.stats.prefillTokens).toBe(2 * 512 + 100);
    expect(r.fabric.sent('d')).toBeCloseTo(6 * 512 * 1000, 0);
    // the answer's cached tokens count the fetched units, as vLLM's count what its KV connector loaded
    expect(seq.cachedTokens).toBe(6 * 512);
  });

  it('the engine a prefix is fetched from pays: its decode steps stall while the bytes leave it', async () => {
    const r = pair();
    const decoding = r.d.core.submit(new Sequence({ kind: 'local', hashes: [], promptTokens: 100, maxTokens: 40 }));
    await decoding.next();
    const alone = (await decoding.next()).stepMs;
    // 5 MB at 100 kB/ms leaves d over 50 ms: each step it overlaps lengthens by half as much again
    const fetch = r.fabric.transfer('d', 'p', 5_000_000);
    const during = (await decoding.next()).stepMs;
    await fetch;
    expect(during).toBeGreaterThan(alone * 1.4);
    expect(r.d.core.stats.stallMs).toBeGreaterThan(0);
  });

  it('is a preset choice: seed 000 (OpenInfer mesh) fetches, seed 002 (vLLM + Mooncake) does not; prefill FLOPs leave out the embeddings', () => {
    expect(resolveModel({ preset: 'seed000' }).prefixMesh).toBe(true);
    expect(resolveModel({ preset: 'seed002' }).prefixMesh).toBe(false);
    expect(resolveModel({ preset: 'default' }).prefixMesh).toBe(false);
    // Qwen3-14B: 14.8 B less 2 x 151,936 x 5,120 embedding parameters
    expect(resolveModel({ preset: 'seed000' }).cost.linearFlopsPerToken).toBeCloseTo(2 * (14.8e9 - 2 * 151936 * 5120), -3);
    // Qwen3-Coder-30B-A3B: 3.3 B active less 2 x 151,936 x 2,048
    expect(resolveModel({ preset: 'seed002' }).cost.linearFlopsPerToken).toBeCloseTo(2 * (3.3e9 - 2 * 151936 * 2048), -3);
  });
});
