import { describe, expect, it } from 'vitest';
import { BLOCK_CHARS, blockText, promptOfTraceRequest, traceCeiling } from '../../bench/lib/trace.mjs';
import { chainedBlockHashes } from '../../sim/prefix-cache.mjs';
import { mulberry32 } from '../../bench/lib/text.mjs';

const commonPrefix = (a, b) => {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  return i;
};

describe('trace ceiling (one infinite cache, file order)', () => {
  it('counts blocks seen before over all blocks', () => {
    const trace = [
      { hash_ids: [0, 1, 2] }, // 0 hits of 3
      { hash_ids: [0, 1, 3] }, // 2 of 3
      { hash_ids: [0, 4] }, // 1 of 2
      { hash_ids: [5] }, // 0 of 1
      { hash_ids: [0, 1, 3, 6] }, // 3 of 4
    ];
    expect(traceCeiling(trace)).toEqual({ hits: 6, total: 13, ratio: 6 / 13 });
  });

  it('is 0 for an empty trace and for all-distinct blocks', () => {
    expect(traceCeiling([]).ratio).toBe(0);
    expect(traceCeiling([{ hash_ids: [1, 2] }, { hash_ids: [3] }]).ratio).toBe(0);
  });
});

describe('prompt text from hash ids', () => {
  it('gives the same text for the same id, a full block of ASCII', () => {
    expect(blockText(42)).toBe(blockText(42));
    expect(blockText(42)).toHaveLength(BLOCK_CHARS);
    expect(/^[\x20-\x7e]*$/.test(blockText(123456))).toBe(true);
  });

  it('gives different text for different ids', () => {
    const seen = new Set();
    for (let id = 0; id < 3000; id++) seen.add(blockText(id));
    for (const id of [36 ** 3, 36 ** 4, 182789, 2 ** 31]) seen.add(blockText(id));
    expect(seen.size).toBe(3004);
  });

  it('cuts the prompt to input_length tokens of 4 characters', () => {
    const p = promptOfTraceRequest({ input_length: 1300, hash_ids: [0, 7, 9] });
    expect(p).toHaveLength(5200);
    expect(p.slice(0, BLOCK_CHARS)).toBe(blockText(0));
    expect(p.slice(2 * BLOCK_CHARS)).toBe(blockText(9).slice(0, 5200 - 2 * BLOCK_CHARS));
  });

  it('two requests sharing k leading ids share exactly k blocks of text and differ right after', () => {
    const a = promptOfTraceRequest({ input_length: 2048, hash_ids: [0, 11, 12, 13] });
    const b = promptOfTraceRequest({ input_length: 2048, hash_ids: [0, 11, 14, 15] });
    expect(commonPrefix(a, b)).toBe(2 * BLOCK_CHARS);
    // the simulated engine's chained block hashes agree on exactly those blocks
    const ha = chainedBlockHashes(a, BLOCK_CHARS);
    const hb = chainedBlockHashes(b, BLOCK_CHARS);
    expect(ha.slice(0, 2)).toEqual(hb.slice(0, 2));
    expect(ha[2]).not.toBe(hb[2]);
  });

  it('any two different ids differ within the few characters of their tag', () => {
    const random = mulberry32(63);
    for (let k = 0; k < 200; k++) {
      const x = Math.floor(random() * 200000);
      const y = Math.floor(random() * 200000);
      if (x === y) continue;
      const a = promptOfTraceRequest({ input_length: 1024, hash_ids: [0, x] });
      const b = promptOfTraceRequest({ input_length: 1024, hash_ids: [0, y] });
      const shared = commonPrefix(a, b);
      expect(shared).toBeGreaterThanOrEqual(BLOCK_CHARS);
      expect(shared).toBeLessThan(BLOCK_CHARS + 5);
    }
  });
});

describe('trace --cells (docs/scaling.md: a pool cut into cells)', () => {
  it('reads the cell counts to run, 1 by default, and refuses anything but integers from 1 to 64', async () => {
    const { cellsOption } = await import('../../bench/scenarios/trace.mjs');
    expect(cellsOption(undefined)).toEqual([1]);
    expect(cellsOption('1,2,4')).toEqual([1, 2, 4]);
    for (const bad of ['0', '2.5', '65', 'x', '1,,2']) expect(() => cellsOption(bad)).toThrow(/--cells/);
  });

  it("shows the engines' peak KV use beside the figures of runs that have it, and not for older reports", async () => {
    const { traceMarkdown } = await import('../../bench/scenarios/trace.mjs');
    const row = {
      policy: 'cache_aware, 2 cells',
      hitRatio: 0.3,
      ofCeiling: 1,
      maxOverMean: 1,
      maxOverMeanTokens: 1,
      requestsPerNode: { a: 1 },
      localityMissBlocks: 0,
      errors: 0,
      devProxyRetries: 0,
      wallS: 1,
      requestsPerS: 1,
    };
    const withPeak = traceMarkdown({ ceiling: 0.3, config: { requests: 1 }, results: [{ ...row, kvPeak: 0.085 }] });
    expect(withPeak).toContain('| KV use peak |');
    expect(withPeak).toContain('| 0.085 |');
    expect(traceMarkdown({ ceiling: 0.3, config: { requests: 1 }, results: [row] })).not.toContain('KV use peak');
  });
});
