import { describe, expect, it } from 'vitest';
import { multiturnFigures } from '../../bench/scenarios/multiturn.mjs';

// The multiturn scenario's figures from what the engines recorded: the P-side fetches of seed 000's
// mesh, counted per turn after the first, and how many of them a decode node served (the seed: "P
// nodes fetch prefixes from other P nodes and even from D nodes"; a D that serves one stalls its decode).

const engine = (role) => ({
  role,
  ttftMs: [],
  tpotMs: [],
  itlMs: [],
  outputTokens: 0,
  busyMs: 1,
  cachedTokens: 0,
  promptTokens: 1,
  localityMissBlocks: 0,
  fullRepulls: 0,
  suffixPulls: 0,
  blocksPulled: 0,
  ingestStallMs: 0,
  kvUsagePeak: 0,
  requests: { vllmPrefill: 0, vllmDecode: 0 },
});

describe('multiturn figures', () => {
  it('counts the turns whose P fetched its prefix, and those a decode node served', () => {
    const stats = { p0: engine('prefill'), p1: engine('prefill'), d0: engine('decode') };
    const perRequest = {
      // turn 1 is never counted (nothing to fetch yet)
      'conv0-turn1': { p0: { prefixFetchedUnits: 4, prefixFetchFrom: 'd0' } },
      'conv0-turn2': { p1: { prefixFetchedUnits: 4, prefixFetchFrom: 'p0' }, d0: {} },
      'conv0-turn3-0123abcd1': { p0: { prefixFetchedUnits: 6, prefixFetchFrom: 'd0' }, d0: {} },
      'conv1-turn2': { p0: {}, d0: {} },
    };
    const f = multiturnFigures({ turns: [], stats, perRequest, wallS: 1, simSpanMs: 1000, timeScale: 1, concurrency: 1 });
    expect(f.turnsAfterFirst).toBe(3);
    expect(f.prefillCrossNodeFetches).toBe(2);
    expect(f.prefillFetchesFromDecode).toBe(1);
  });
});
