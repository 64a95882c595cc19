import { describe, expect, it } from 'vitest';
import { decodeKvCeiling } from '../../bench/lib/decode-kv-ceiling.mjs';
import { agenticTrace } from '../../bench/lib/agentic-trace.mjs';
import { resolveModel } from '../../sim/presets.mjs';

// Seed 002's decode KV wall (issue 22): how much decode KV a closed loop of sessions can hold at
// all, whatever the engines do, when KV use counts only the blocks requests hold (vLLM).

describe('the decode KV ceiling of a closed-loop replay', () => {
  const one = (/** @type {number} */ session, /** @type {number} */ input, /** @type {number} */ output) => ({ session, input_length: input, output_length: output });

  it('holds each request for its decode, sessions in slots, a session one turn at a time', () => {
    const trace = [one(0, 90, 10), one(1, 190, 10)];
    // one slot: 100 tokens for 100 ms, then 200 tokens for 100 ms
    expect(decodeKvCeiling(trace, { inflight: 1, tpotMs: 10, capacityTokens: 1000 })).toEqual({ mean: 0.15, peak: 0.2, spanS: 0.2 });
    // two slots: both at once
    expect(decodeKvCeiling(trace, { inflight: 2, tpotMs: 10, capacityTokens: 1000 })).toEqual({ mean: 0.3, peak: 0.3, spanS: 0.1 });
    // a session's second turn follows its first: no overlap even without a cap
    const turns = [one(0, 90, 10), one(0, 290, 10)];
    expect(decodeKvCeiling(turns, { inflight: 0, tpotMs: 10, capacityTokens: 1000 })).toEqual({ mean: 0.2, peak: 0.3, spanS: 0.2 });
  });

  it('keeps seed 002 6P+2D below the wall with 8 sessions in flight: 2 decode nodes of the preset cannot average 0.85', () => {
    // H20 96 GiB x 0.9 - 61 GB of weights - 4 GiB, at 96 KiB a token: 279,488 tokens a node
    const m = resolveModel({ preset: 'seed002' });
    const capacityTokens = 2 * m.numGpuBlocks * m.blockSize;
    expect(capacityTokens).toBe(2 * 279488);
    const trace = agenticTrace({ requests: 1000 });
    // published 6P+2D TPOT p90 77 ms: every request decoding at it, back to back
    const at8 = decodeKvCeiling(trace, { inflight: 8, tpotMs: 77, capacityTokens });
    expect(at8.mean).toBeLessThan(0.6);
    // twice the sessions would reach the wall: the cap, not the engines, keeps ours below it
    const at16 = decodeKvCeiling(trace, { inflight: 16, tpotMs: 77, capacityTokens });
    expect(at16.mean).toBeGreaterThan(0.8);
    // the 50-request breakdown's requests cannot fill the two nodes even all at once
    expect(decodeKvCeiling(agenticTrace({ requests: 50 }), { inflight: 8, tpotMs: 77, capacityTokens }).peak).toBeLessThan(0.5);
  });
});
