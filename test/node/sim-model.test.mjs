import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { SimClock } from '../../sim/model/clock.mjs';
import { Fabric } from '../../sim/model/fabric.mjs';
import { KvMemory } from '../../sim/model/kv-memory.mjs';
import { EngineCore, Sequence } from '../../sim/model/scheduler.mjs';
import { stepTime, touchedExpertShare } from '../../sim/model/step-time.mjs';
import { resolveModel } from '../../sim/presets.mjs';

// The engine model's mechanisms, one at a time, on a discrete-event clock (timeScale 0): every
// figure here is simulated time, so the tests are exact and do not depend on the machine.

const hashes = (tag, n) => Array.from({ length: n }, (_, i) => `${tag}-${i}`);

describe('KV memory (vLLM block manager)', () => {
  const mem = () => new KvMemory({ numBlocks: 320, blockSize: 16, unitTokens: 512 }); // 10 units of 32 blocks

  it('holds a running request’s blocks and reports their share as usage', () => {
    const m = mem();
    const a = m.allocate(hashes('a', 3), 100); // 3 units + 7 blocks for 100 tokens
    expect(a).not.toBeNull();
    expect(m.heldBlocks).toBe(3 * 32 + 7);
    expect(m.usage()).toBeCloseTo((3 * 32 + 7) / 320, 10);
  });

  it('keeps a finished request’s computed units as free-but-reusable cache, and a later request takes them back', () => {
    const m = mem();
    const a = m.allocate(hashes('a', 3), 10);
    m.markReady(a);
    m.release(a);
    expect(m.usage()).toBe(0); // cached blocks count as free
    expect(m.lookup(hashes('a', 4))).toBe(3);
    const b = m.allocate(hashes('a', 4), 0);
    expect(m.heldBlocks).toBe(4 * 32);
    m.release(b);
  });

  it('evicts the least recently used cached units, a chain’s tail before its head', () => {
    const m = mem();
    const a = m.allocate(hashes('a', 4), 0);
    m.markReady(a);
    m.release(a); // 4 cached
    const b = m.allocate(hashes('b', 8), 0); // needs 8 of 10 units: 2 cached units must go
    expect(b).not.toBeNull();
    expect(m.evictions).toBe(2);
    expect(m.lookup(hashes('a', 4))).toBe(2); // the head survives
  });

  it('refuses an allocation that does not fit, taking nothing', () => {
    const m = mem();
    const a = m.allocate(hashes('a', 9), 0);
    expect(m.allocate(hashes('b', 2), 0)).toBeNull();
    expect(m.heldBlocks).toBe(9 * 32);
    m.release(a);
    expect(m.heldBlocks).toBe(0);
  });

  it('grows a decoding request block by block, and says when it cannot', () => {
    const m = new KvMemory({ numBlocks: 40, blockSize: 16, unitTokens: 512 });
    const a = m.allocate(hashes('a', 1), 1); // 32 blocks + 1
    expect(m.grow(a, 512 + 16)).toBe(true);
    expect(m.grow(a, 512 + 17)).toBe(true);
    expect(a.privateBlocks).toBe(2);
    expect(m.grow(a, 512 + 16 * 8)).toBe(true);
    expect(m.grow(a, 512 + 16 * 8 + 1)).toBe(false);
  });

  it('never holds more than its capacity, whatever requests come and go (property)', () => {
    fc.assert(
      fc.property(fc.array(fc.tuple(fc.integer({ min: 0, max: 5 }), fc.integer({ min: 0, max: 6 }), fc.integer({ min: 0, max: 600 }), fc.boolean()), { maxLength: 60 }), (ops) => {
        const m = mem();
        const live = [];
        for (const [tag, units, tail, release] of ops) {
          if (release && live.length > 0) {
            const a = live.shift();
            m.markReady(a);
            m.release(a);
          } else {
            const a = m.allocate(hashes(`t${tag}`, units), tail);
            if (a) live.push(a);
          }
          expect(m.heldBlocks).toBeGreaterThanOrEqual(0);
          expect(m.occupiedBlocks()).toBeLessThanOrEqual(m.numBlocks);
          expect(m.freeBlocks()).toBeGreaterThanOrEqual(0);
        }
        for (const a of live) m.release(a);
        expect(m.heldBlocks).toBe(0);
      }),
    );
  });
});

describe('step time (roofline)', () => {
  const { cost } = resolveModel({ preset: 'seed000' });

  it('a decode step is bound by reading weights and KV: it grows with the batch and the context', () => {
    const one = stepTime(cost, { decodeContexts: [8192], prefills: [] });
    const eight = stepTime(cost, { decodeContexts: Array(8).fill(8192), prefills: [] });
    const longer = stepTime(cost, { decodeContexts: Array(8).fill(32768), prefills: [] });
    expect(one.memoryMs).toBeGreaterThan(one.computeMs);
    expect(eight.ms).toBeGreaterThan(one.ms);
    expect(longer.ms).toBeGreaterThan(eight.ms);
    // Qwen3-14B on an H200: 29.6 GB of weights at 4.8 TB/s x MBU, + 1.3 GB of KV per 8k sequence
    expect(one.ms).toBeGreaterThan((29.6e9 / 4.8e12) * 1000);
  });

  it('a prefill chunk in a decode step lengthens that step for every sequence in it (interference)', () => {
    const decodes = Array(8).fill(8192);
    const alone = stepTime(cost, { decodeContexts: decodes, prefills: [] });
    const mixed = stepTime(cost, { decodeContexts: decodes, prefills: [{ tokens: 2048, context: 0 }] });
    expect(mixed.ms).toBeGreaterThan(alone.ms * 3);
    expect(mixed.computeMs).toBeGreaterThan(mixed.memoryMs);
  });

  it('prefill grows with new tokens times their context (attention)', () => {
    const cold = stepTime(cost, { decodeContexts: [], prefills: [{ tokens: 2048, context: 0 }] });
    const deep = stepTime(cost, { decodeContexts: [], prefills: [{ tokens: 2048, context: 30000 }] });
    expect(deep.ms).toBeGreaterThan(cold.ms * 1.5);
  });

  it('a MoE step reads the experts its tokens route to', () => {
    expect(touchedExpertShare(1, 128, 8)).toBeCloseTo(8 / 128, 10);
    expect(touchedExpertShare(64, 128, 8)).toBeGreaterThan(0.98);
    const moe = resolveModel({ preset: 'seed002' }).cost;
    const d1 = stepTime(moe, { decodeContexts: [1000], prefills: [] });
    const d32 = stepTime(moe, { decodeContexts: Array(32).fill(1000), prefills: [] });
    expect(d32.memoryMs - d1.memoryMs).toBeGreaterThan((moe.expertWeightBytes * 0.5) / moe.bytesPerMs);
  });
});

/** An engine core on a discrete-event clock, with its link on a fabric. */
function rig({ numBlocks = 100000, stallLoadBytesPerMs = Infinity, maxNumBatchedTokens = 8192, preset = 'default', link = Infinity } = {}) {
  const clock = new SimClock(0);
  const fabric = new Fabric(clock);
  const figures = resolveModel({ preset, cacheBlocks: 5000 });
  const memory = new KvMemory({ numBlocks, blockSize: 16, unitTokens: 512 });
  fabric.register('p', { linkBytesPerMs: link });
  fabric.register('d', { linkBytesPerMs: link });
  const core = new EngineCore({
    clock,
    memory,
    cost: figures.cost,
    maxNumBatchedTokens,
    maxNumSeqs: 1024,
    preemption: true,
    stallLoadBytesPerMs,
    moved: () => fabric.stalling('d'),
  });
  const submit = (o) => core.submit(new Sequence({ kind: 'local', hashes: [], maxTokens: 1, ...o }));
  return { clock, fabric, figures, memory, core, submit };
}

/** Every token of a sequence: [{ index, at, stepMs }]. */
async function tokens(seq) {
  const out = [];
  for (let t = await seq.next(); t; t = await seq.next()) out.push(t);
  return out;
}

describe('scheduler (continuous batching)', () => {
  it('a full decode engine makes the next request wait for KV memory, FCFS', async () => {
    // room for one 1,000-token request at a time
    const r = rig({ numBlocks: 80 });
    const big = r.submit({ hashes: [], promptTokens: 1000, maxTokens: 50 });
    const next = r.submit({ hashes: [], promptTokens: 1000, maxTokens: 5 });
    const small = r.submit({ hashes: [], promptTokens: 10, maxTokens: 5 }); // fits, but may not overtake
    await Promise.all([big.finished, next.finished, small.finished]);
    expect(next.admittedAt).toBeGreaterThanOrEqual(big.finishedAt);
    expect(next.kvWaitMs).toBeCloseTo(next.admittedAt - next.arrival, 6);
    expect(next.kvWaitMs).toBeGreaterThan(0);
    expect(small.admittedAt).toBeGreaterThanOrEqual(next.admittedAt); // head-of-line blocking
    expect(r.core.usageSummary(r.clock.now()).peak).toBeGreaterThan(0.8);
  });

  it('prefills a long prompt in chunks of the token budget, decoding the others between', async () => {
    const r = rig({ maxNumBatchedTokens: 2048 });
    const decoding = r.submit({ hashes: [], promptTokens: 100, maxTokens: 40 });
    await decoding.next();
    const long = r.submit({ hashes: [], promptTokens: 6000, maxTokens: 1 });
    const itl = (await tokens(decoding)).map((t) => t.stepMs);
    await long.finished;
    // 6000 tokens under a 2048 budget that also carries the decode token: 3 or 4 chunks
    const chunks = itl.filter((ms) => ms > 50).length;
    expect(chunks).toBeGreaterThanOrEqual(3);
    expect(chunks).toBeLessThanOrEqual(4);
    expect(Math.max(...itl)).toBeLessThan(2048 * 0.05 + 40); // never one 300 ms step
  });

  it('a decode node prefilling a request by itself lengthens the steps of its running decodes', async () => {
    const r = rig();
    const decoding = r.submit({ hashes: [], promptTokens: 100, maxTokens: 30 });
    await decoding.next();
    const before = [(await decoding.next()).stepMs, (await decoding.next()).stepMs];
    r.submit({ hashes: [], promptTokens: 4000, maxTokens: 1 }); // kind local: prefilled here
    const rest = (await tokens(decoding)).map((t) => t.stepMs);
    // one step carries the whole 4,000-token prefill (under the 8,192 budget) and the decode token
    const long = rest.filter((ms) => ms > before[1] * 5);
    expect(long).toHaveLength(1);
    expect(long[0]).toBeGreaterThan(stepTime(r.figures.cost, { decodeContexts: [], prefills: [{ tokens: 4000, context: 0 }] }).ms);
  });

  it('preempts the newest request when a running one cannot grow, and recomputes it later', async () => {
    const r = rig({ numBlocks: 70 });
    const a = r.submit({ hashes: [], promptTokens: 500, maxTokens: 300 });
    const b = r.submit({ hashes: [], promptTokens: 500, maxTokens: 300 });
    await Promise.all([a.finished, b.finished]);
    expect(a.state).toBe('finished');
    expect(b.state).toBe('finished');
    expect(a.preemptions + b.preemptions).toBeGreaterThan(0);
    expect(r.core.stats.preemptions).toBeGreaterThan(0);
  });

  it('a P leg with hold keeps its blocks after it answered, until released', async () => {
    const r = rig();
    const p = r.core.submit(new Sequence({ kind: 'prefill', hashes: hashes('x', 2), promptTokens: 1100, maxTokens: 1, hold: true }));
    await p.finished;
    expect(r.memory.heldBlocks).toBeGreaterThan(0);
    r.core.releaseHeld(p);
    expect(r.memory.heldBlocks).toBe(0);
    expect(r.memory.lookup(hashes('x', 2))).toBe(2); // and they stay cached
  });
});

describe('fabric (KV transfer over the links)', () => {
  it('concurrent transfers share a link', async () => {
    const clock = new SimClock(0);
    const f = new Fabric(clock);
    for (const id of ['p0', 'p1', 'd']) f.register(id, { linkBytesPerMs: 1000 });
    const alone = await f.transfer('p0', 'd', 10000);
    expect(alone.ms).toBeCloseTo(10, 6);
    const [x, y] = await Promise.all([f.transfer('p0', 'd', 10000), f.transfer('p1', 'd', 10000)]);
    expect(x.ms).toBeCloseTo(20, 6);
    expect(y.ms).toBeCloseTo(20, 6);
    expect(f.landed('d')).toBeCloseTo(30000, 3);
  });

  it('a transfer across groups gets a share of the rate and waits longer', async () => {
    const clock = new SimClock(0);
    const f = new Fabric(clock, { crossGroupShare: 0.5, crossGroupLatencyMs: 2 });
    f.register('pa', { linkBytesPerMs: 1000, group: 'a' });
    f.register('da', { linkBytesPerMs: 1000, group: 'a' });
    f.register('db', { linkBytesPerMs: 1000, group: 'b' });
    const inGroup = await f.transfer('pa', 'da', 10000);
    const across = await f.transfer('pa', 'db', 10000);
    expect(inGroup.crossGroup).toBe(false);
    expect(across.crossGroup).toBe(true);
    expect(across.ms).toBeCloseTo(2 + 20, 6);
  });

  it('a concurrent transfer into an engine slows its decode step (the collision)', async () => {
    const r = rig({ link: 100_000, stallLoadBytesPerMs: 200_000 });
    const decoding = r.submit({ hashes: [], promptTokens: 100, maxTokens: 40 });
    await decoding.next();
    const alone = (await decoding.next()).stepMs;
    // 5 MB at 100 kB/ms lands over 50 ms: half as much again on each step it overlaps
    const pull = r.fabric.transfer('p', 'd', 5_000_000);
    const during = (await decoding.next()).stepMs;
    await pull;
    expect(during).toBeGreaterThan(alone * 1.4);
    expect(r.core.stats.stallMs).toBeGreaterThan(0);
  });

  it("only a transfer's stalling bytes slow the steps at its ends (a prefill's fresh KV streams as its layers finish)", async () => {
    const r = rig({ link: 100_000, stallLoadBytesPerMs: 200_000 });
    const decoding = r.submit({ hashes: [], promptTokens: 100, maxTokens: 40 });
    await decoding.next();
    const alone = (await decoding.next()).stepMs;
    // 5 MB of which none stalls: the steps it overlaps are as long as before
    const fresh = r.fabric.transfer('p', 'd', 5_000_000, undefined, 0);
    const during = (await decoding.next()).stepMs;
    await fresh;
    expect(during).toBeCloseTo(alone, 2);
    expect(r.core.stats.stallMs).toBe(0);
    expect(r.fabric.landed('d')).toBeCloseTo(5_000_000, 0);
    // 5 MB of which 2 MB stall (P's cached context D lacked): 10 ms of steps at 200 kB/ms, both ends counted
    await r.fabric.transfer('p', 'd', 5_000_000, undefined, 2_000_000);
    expect(r.fabric.stalling('d')).toBeCloseTo(2_000_000, 0);
    expect(r.fabric.stalling('p')).toBeCloseTo(2_000_000, 0);
    for (let t = await decoding.next(); t; t = await decoding.next());
    expect(r.core.stats.stallMs).toBeCloseTo(10, 6);
  });

  it('a remote request holds its blocks while its KV arrives, waiting, not running, and one behind it waits for KV', async () => {
    // vLLM WAITING_FOR_REMOTE_KVS: the connector's blocks are allocated when the request is
    // scheduled and count in kv_cache_usage through the pull (seed 002's decode KV wall)
    const r = rig({ numBlocks: 200, link: 1000 });
    const pulling = r.core.submit(
      new Sequence({ kind: 'remote', hashes: hashes('w', 3), promptTokens: 1600, maxTokens: 2, load: (missing) => r.fabric.transfer('p', 'd', missing * 1000) }),
    );
    await r.clock.sleep(800); // halfway through a 1,600 ms pull
    expect(r.core.counts()).toEqual({ waiting: 1, running: 0 });
    expect(r.memory.usage()).toBe((3 * 32 + 5) / 200); // 3 units + 64 tokens and the first output token
    const behind = r.submit({ promptTokens: 2400 }); // 151 blocks: not while the pull holds 101
    await r.clock.sleep(1);
    expect(r.core.counts()).toEqual({ waiting: 2, running: 0 });
    await pulling.finished;
    await behind.finished;
    expect(behind.kvWaitMs).toBeGreaterThan(790);
  });

  it('a remote request pulls only the blocks this engine does not hold', async () => {
    const r = rig({ link: 1_000_000 });
    const pulls = [];
    const remote = (h, promptTokens) =>
      r.core.submit(
        new Sequence({
          kind: 'remote',
          hashes: h,
          promptTokens,
          maxTokens: 2,
          load: (missing) => {
            pulls.push(missing);
            return r.fabric.transfer('p', 'd', missing * 1000);
          },
        }),
      );
    const first = remote(hashes('c', 3), 1600);
    await first.finished;
    const second = remote(hashes('c', 5), 2600); // the same conversation, two units longer
    await second.finished;
    expect(pulls).toEqual([1600, 2600 - 3 * 512]);
    expect(second.hitUnits).toBe(3);
  });
});
