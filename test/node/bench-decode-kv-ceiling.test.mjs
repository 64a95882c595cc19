import { describe, expect, it } from 'vitest';
import { decodeKvCeiling } from '../../bench/lib/decode-kv-ceiling.mjs';
import { agenticTrace } from '../../bench/lib/agentic-trace.mjs';
import { resolveModel } from '../../sim/presets.mjs';

// Seed 002's decode KV wall (issue 22): how much decode KV a closed loop of sessions can hold at
// all, whatever the engines do, when KV use counts only the blocks requests hold (vLLM).

describe('the decode KV ceiling of a closed-loop replay', () => {
  const one = (/** @type {number} */ session, /** @type {number} */ input, /** @type {number} */ output) => ({ session, input_length: input, output_length: output });

  it('holds each request for its whole decode, over the shortest span the sessions allow, one request a session at once', () => {
    const trace = [one(0, 90, 10), one(1, 190, 10)];
    // one slot: 100 tokens for 100 ms, then 200 tokens for 100 ms
    expect(decodeKvCeiling(trace, { inflight: 1, tpotMs: 10, capacityTokens: 1000 })).toEqual({ mean: 0.15, peak: 0.2, spanS: 0.2 });
    // two slots: both at once
    expect(decodeKvCeiling(trace, { inflight: 2, tpotMs: 10, capacityTokens: 1000 })).toEqual({ mean: 0.3, peak: 0.3, spanS: 0.1 });
    // a session's second turn follows its first: its span is theirs, its peak its larger turn, even without a cap
    const turns = [one(0, 90, 10), one(0, 290, 10)];
    expect(decodeKvCeiling(turns, { inflight: 0, tpotMs: 10, capacityTokens: 1000 })).toEqual({ mean: 0.2, peak: 0.3, spanS: 0.2 });
    // a long session sets the span however many slots there are
    const long = [one(0, 90, 10), one(0, 90, 10), one(0, 90, 10), one(1, 90, 10)];
    expect(decodeKvCeiling(long, { inflight: 4, tpotMs: 10, capacityTokens: 1000 }).spanS).toBe(0.3);
  });

  it('keeps seed 002 6P+2D below the wall with 8 sessions in flight: 2 decode nodes of the preset cannot average 0.85', () => {
    // H20 96 GiB x 0.9 - 61 GB of weights - 4 GiB, at 96 KiB a token: 279,488 tokens a node
    const m = resolveModel({ preset: 'seed002' });
    const capacityTokens = 2 * m.numGpuBlocks * m.blockSize;
    expect(capacityTokens).toBe(2 * 279488);
    const trace = agenticTrace({ requests: 1000 });
    // published 6P+2D TPOT p90 77 ms: every request holding its prompt and output for its whole decode
    expect(decodeKvCeiling(trace, { inflight: 8, tpotMs: 77, capacityTokens }).mean).toBeLessThan(0.65);
    // 12 sessions could reach the wall: the cap, not the engines, keeps ours below it
    expect(decodeKvCeiling(trace, { inflight: 12, tpotMs: 77, capacityTokens }).mean).toBeGreaterThan(0.85);
    // the 50-request breakdown lasts as long as its longest session: a mean of a seventh of the nodes at most
    expect(decodeKvCeiling(agenticTrace({ requests: 50 }), { inflight: 8, tpotMs: 77, capacityTokens }).mean).toBeLessThan(0.15);
  });
});
