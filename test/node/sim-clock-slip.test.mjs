import { describe, expect, it } from 'vitest';
import { SimClock } from '../../sim/model/clock.mjs';
import { KvMemory } from '../../sim/model/kv-memory.mjs';
import { EngineCore, Sequence } from '../../sim/model/scheduler.mjs';
import { resolveModel } from '../../sim/presets.mjs';

// A paced clock on a machine whose event loop runs late (a benchmark sharing two cores with
// workerd and other runs): the engine's step loop chains its steps in simulated time and falls
// behind the clock, while a request arriving meanwhile is stamped with the clock's now(). The
// step that admits it must not be earlier than its arrival, or its queue time is negative and
// its TTFT too short.

/** Blocks the event loop for `ms` real milliseconds. @param {number} ms */
function blockEventLoop(ms) {
  const until = performance.now() + ms;
  while (performance.now() < until) {
    // busy: no timer fires meanwhile
  }
}

describe('engine step loop behind a late event loop', () => {
  it('admits a request no earlier than it arrived, and its first token comes after its arrival', async () => {
    // 1 simulated ms = 0.05 real ms: a 16 ms decode step is 0.8 ms of real time
    const clock = new SimClock(0.05);
    const figures = resolveModel({ preset: 'default', cacheBlocks: 5000 });
    const memory = new KvMemory({ numBlocks: 100000, blockSize: 16, unitTokens: 512 });
    const core = new EngineCore({ clock, memory, cost: figures.cost, maxNumBatchedTokens: 8192, maxNumSeqs: 1024, preemption: true, stallLoadBytesPerMs: Infinity });
    try {
      const decoding = core.submit(new Sequence({ kind: 'local', hashes: [], promptTokens: 100, maxTokens: 400 }));
      await decoding.next();
      // 60 real ms late = 1,200 simulated ms the step loop is behind the clock
      blockEventLoop(60);
      const late = core.submit(new Sequence({ kind: 'local', hashes: [], promptTokens: 100, maxTokens: 2 }));
      await late.finished;
      expect(late.state).toBe('finished');
      expect(late.admittedAt).toBeGreaterThanOrEqual(late.arrival);
      expect(late.firstTokenAt).toBeGreaterThan(late.arrival);
      await decoding.finished;
      expect(decoding.state).toBe('finished');
    } finally {
      core.close();
      clock.close();
    }
  });

  it('requests that arrive while the step loop is behind wait for it to reach their arrival', async () => {
    const clock = new SimClock(0.05);
    const figures = resolveModel({ preset: 'default', cacheBlocks: 5000 });
    const memory = new KvMemory({ numBlocks: 100000, blockSize: 16, unitTokens: 512 });
    const core = new EngineCore({ clock, memory, cost: figures.cost, maxNumBatchedTokens: 8192, maxNumSeqs: 1024, preemption: true, stallLoadBytesPerMs: Infinity });
    try {
      const first = core.submit(new Sequence({ kind: 'local', hashes: [], promptTokens: 100, maxTokens: 50 }));
      await first.next();
      blockEventLoop(40);
      // submitted while the loop is still behind: it waits for the loop to reach its arrival
      const seqs = [1, 2, 3].map(() => core.submit(new Sequence({ kind: 'local', hashes: [], promptTokens: 50, maxTokens: 1 })));
      await Promise.all([first.finished, ...seqs.map((s) => s.finished)]);
      for (const s of seqs) {
        expect(s.state).toBe('finished');
        expect(s.admittedAt).toBeGreaterThanOrEqual(s.arrival);
      }
    } finally {
      core.close();
      clock.close();
    }
  });
});
