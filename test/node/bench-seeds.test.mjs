import { describe, expect, it } from 'vitest';
import { inSlots } from '../../bench/scenarios/agentic.mjs';
import { PUBLISHED_HIT_BUCKETS, agenticProfile, agenticTrace } from '../../bench/lib/agentic-trace.mjs';
import { compareRatio } from '../../bench/lib/seeds.mjs';

// The seeds' replay, its pure parts: the agentic trace's hit buckets, the closed loop, the scoring.
// The scenarios run end to end (--quick) in test/e2e/bench-quick.test.mjs (`npm run test:e2e`).

describe('the agentic trace (seed 002 profile)', () => {
  it('has the published hit buckets and mean input at 1,000 requests: mostly cold, reuse within sessions', () => {
    const p = agenticProfile(agenticTrace({ requests: 1000 }));
    expect(p.requests).toBe(1000);
    // the study's requests by prefix hit: 55% cold, 8% at 1-50%, 14% at 50-90%, 22% above 90%
    for (const [k, v] of Object.entries(PUBLISHED_HIT_BUCKETS)) {
      expect(Math.abs(p.hitBuckets[k].share - v.share)).toBeLessThan(0.03);
      expect(p.hitBuckets[k].newTokens / v.newTokens).toBeGreaterThan(k === '>90%' ? 0.8 : 0.85);
      expect(p.hitBuckets[k].newTokens / v.newTokens).toBeLessThan(k === '>90%' ? 1.5 : 1.15);
    }
    expect(p.inputMean).toBeGreaterThan(33600 * 0.95);
    expect(p.inputMean).toBeLessThan(33600 * 1.05);
    // the published quantiles (p50 20k, p90 88k) fit the cold prompts' spread: the p90 within 10%
    // (the narrower spread before gave 76k), the p50 within 20%
    expect(p.inputP90 / 88000).toBeGreaterThan(0.9);
    expect(p.inputP90 / 88000).toBeLessThan(1.1);
    expect(p.inputP50 / 20000).toBeLessThan(1.2);
    expect(p.outputMean).toBeGreaterThan(445 * 0.9);
    expect(p.outputMean).toBeLessThan(445 * 1.1);
    expect(p.outputP50).toBeGreaterThan(70);
    expect(p.outputP50).toBeLessThan(95);
    expect(p.singleTurnSessionShare).toBeGreaterThan(0.88);
    expect(p.singleTurnSessionShare).toBeLessThan(0.95);
  });

  it('is the same for the same seed, different for another; tool sets under a Zipf law, cold requests share nothing; a session only grows', () => {
    const a = agenticTrace({ requests: 300 });
    expect(agenticTrace({ requests: 300 })).toEqual(a);
    expect(agenticTrace({ requests: 300, seed: 7 })).not.toEqual(a);
    // the most used tool set is used more than the next (Zipf), and many requests use none
    const uses = new Map();
    for (const r of a) if (r.turn === 1) uses.set(r.toolSet, (uses.get(r.toolSet) ?? 0) + 1);
    expect(uses.get(0)).toBeGreaterThan(uses.get(1) ?? 0);
    expect(uses.get(-1)).toBeGreaterThan(a.length / 3);
    const firstBlocks = new Set();
    for (const r of a) {
      if (r.toolSet === -1) expect(firstBlocks.has(r.hash_ids[0])).toBe(false);
      firstBlocks.add(r.hash_ids[0]);
    }
    const bySession = new Map();
    for (const r of a) bySession.set(r.session, [...(bySession.get(r.session) ?? []), r]);
    for (const turns of bySession.values()) {
      for (let i = 1; i < turns.length; i++) {
        const kept = Math.floor(turns[i - 1].input_length / 512);
        expect(turns[i].hash_ids.slice(0, kept)).toEqual(turns[i - 1].hash_ids.slice(0, kept));
        expect(turns[i].input_length).toBeGreaterThan(turns[i - 1].input_length);
      }
    }
  });
});

describe("the closed loop (the study's --max-inflight-sessions)", () => {
  it('runs at most that many sessions at once, in order, each slot taking the next when its session ends', async () => {
    let now = 0;
    let most = 0;
    const started = [];
    await inSlots([5, 1, 1, 1, 3, 1], 2, async (ms) => {
      started.push(ms);
      most = Math.max(most, ++now);
      await new Promise((resolve) => setTimeout(resolve, ms));
      now--;
    });
    expect(most).toBe(2);
    expect(started).toEqual([5, 1, 1, 1, 3, 1]);
    let open = 0;
    await inSlots([1, 1, 1, 1], 0, async () => {
      open = Math.max(open, ++now);
      await new Promise((resolve) => setTimeout(resolve, 1));
      now--;
    });
    expect(open).toBe(4);
  });
});

describe('published ratios against ours', () => {
  it('says whether ours points the same way and lands within ±35%', () => {
    expect(compareRatio('x', 85.2, 23, 70, 25)).toMatchObject({ published: 3.7, ours: 2.8, sameDirection: true, within: true });
    expect(compareRatio('x', 85.2, 23, 20, 25)).toMatchObject({ sameDirection: false, within: false });
    expect(compareRatio('x', 2, 1, 3, 1)).toMatchObject({ sameDirection: true, within: false });
  });
});
