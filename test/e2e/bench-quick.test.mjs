import { describe, expect, it } from 'vitest';
import { runAgentic } from '../../bench/scenarios/agentic.mjs';
import { runGroups } from '../../bench/scenarios/groups.mjs';
import { runMultiturn } from '../../bench/scenarios/multiturn.mjs';

// The seeds' scenarios, small (--quick): the real Worker in workerd in front of the simulated
// engines of each seed's preset. These assert the mechanisms' direction, not the seeds' values.
//
// Here and not in `npm test`: each is a benchmark run, whole processes for minutes, and part of
// what it compares (ITL p99, decode KV use) is paced by the router's real time against the
// engines' simulated time, so a CPU-starved machine moves it (docs/benchmark-seeds.md, "Host
// load"). `npm test` must hold on a busy machine; CI runs these on its own (.ci/run).

describe('seed 000 (multiturn --quick): KV transfers collide with decode steps', () => {
  // At this size (64 turns, a few thousand ITL samples) round-robin's ITL p99 is decided by which
  // few steps a landing happens to hit. What drives the spikes is asserted instead: how much KV
  // lands on the decode nodes and whether it costs their steps time (held KV does, a prefill's
  // fresh KV does not), and the mechanism conditional disaggregation adds, a local prefill
  // lengthening D's steps (3x).
  it('keeping a conversation on its P and D avoids full re-pulls, and with them the KV landing on D; a local prefill on D costs its decodes far more', {
    timeout: 240000,
  }, async () => {
    const { report } = await runMultiturn({ quick: true, config: 'round_robin,pd_affinity,pd_affinity_conditional_4k' });
    const [rr, pd, local] = report.results;
    expect(rr.errors + pd.errors + local.errors).toBe(0);
    expect(rr.requests).toBe(64);
    expect(pd.prefillCrossNodeFetches).toBe(0);
    expect(rr.prefillCrossNodeFetches).toBeGreaterThan(0);
    expect(pd.dFullRepullsAfterFirst).toBe(0);
    expect(rr.decodeFullRepulls).toBeGreaterThan(pd.decodeFullRepulls);
    // round-robin lands more KV on the decode nodes (1.4-1.6x the blocks). Only held KV costs their
    // steps time (sim/model/fabric.mjs): round-robin's re-pulls of a context its P had cached do;
    // P+D affinity's D holds each conversation's context and pulls only what P just computed for
    // the turn, which streams and stalls nothing (seed 000: P+D affinity's ITL p99 is its TPOT p99).
    // How much round-robin loses depends on which steps a landing overlaps (the router's real-time
    // pacing), so that it is charged is asserted, not its size
    expect(rr.dBlocksPulled).toBeGreaterThan(pd.dBlocksPulled * 1.2);
    expect(rr.dLandingMs).toBeGreaterThan(0);
    expect(rr.dLandingShare).toBeGreaterThan(0);
    expect(pd.dLandingMs).toBe(0);
    expect(pd.pHitRatio).toBeGreaterThan(rr.pHitRatio);
    // conditional with the threshold above a turn's new tokens: D prefills every later turn itself
    // (48 of 64 while each conversation keeps its D), pulls mostly first turns, and its prefill
    // steps stall every decode it runs: ~3x P+D affinity's ITL p99 on an idle machine, 1.6x seen
    // with the machine busy (a p99 of the router's real-time pacing): the direction, with a margin
    expect(local.localTurns).toBeGreaterThan(40);
    expect(local.dBlocksPulled).toBeLessThan(pd.dBlocksPulled);
    expect(local.itlP99Ms).toBeGreaterThan(pd.itlP99Ms * 1.25);
    expect(report.comparisons.map((c) => c.what)).toContain('ITL p99: round-robin / P+D affinity');
  });
});

describe('seed 002 (agentic --quick): the decode KV memory wall', () => {
  it('fewer decode nodes fill their KV memory and requests wait for it; cache-aware finds more prefixes; conditional prefills warm turns on D', { timeout: 300000 }, async () => {
    const { report } = await runAgentic({
      quick: true,
      requests: '60',
      // each configuration in its own process, at once: the run's length is its longest request's
      parallel: '4',
      // four rows, as before the conditional one: 4P+4D is represented by its conditional row
      config: 'colocated-8/round_robin,colocated-8/cache_aware,pd-6p2d/cache_aware,pd-4p4d/conditional',
    });
    const by = Object.fromEntries(report.results.map((r) => [r.name, r]));
    for (const r of report.results) {
      expect(r.failed).toBe(0);
      expect(r.completed).toBe(60);
      for (const k of ['ttftP50Ms', 'ttftP90Ms', 'tpotP90Ms', 'e2eP50Ms', 'hitRatio', 'decodeKvPeak', 'decodeKvMean', 'kvWaitShare']) expect(Number.isFinite(r[k])).toBe(true);
      expect(r.decodeKvPeak).toBeLessThanOrEqual(1);
      expect(r.kvWaitShare).toBeLessThanOrEqual(1);
      // every completed request's TTFT, sorted, for runs-spread to pool; its percentiles are the row's
      expect(r.ttftsMs).toHaveLength(60);
      expect(r.ttftsMs).toEqual([...r.ttftsMs].sort((a, b) => a - b));
      expect(r.ttftsMs[Math.ceil(0.5 * 60) - 1]).toBe(r.ttftP50Ms);
      expect(r.ttftsMs[Math.ceil(0.9 * 60) - 1]).toBe(r.ttftP90Ms);
    }
    // half the decode nodes hold the same requests' KV: about twice the use over the run (the peak
    // alone depends on which long prompts happen to overlap). The margin is the direction's: the
    // router runs in real time against simulated engines, and on a machine starved of CPU (four
    // busy loops on 2 cores) the ratio came out at 1.24
    expect(by['pd-6p2d/cache_aware'].decodeKvMean).toBeGreaterThan(by['pd-4p4d/conditional'].decodeKvMean * 1.1);
    expect(by['colocated-8/cache_aware'].hitRatio).toBeGreaterThan(by['colocated-8/round_robin'].hitRatio);
    // conditional: every answer carries its receipt; turns whose prompt D holds are prefilled there
    // alone (a multi-turn session's later turns), cold ones by a P; the router's counters agree
    const cond = by['pd-4p4d/conditional'];
    expect((cond.modes.local ?? 0) + (cond.modes.disaggregated ?? 0)).toBe(60);
    expect(cond.modes.local).toBeGreaterThan(0);
    expect(cond.modes.disaggregated).toBeGreaterThan(0);
    expect(cond.decisions['local/cached']).toBeGreaterThan(0);
    expect(cond.decisions['disaggregated/cold']).toBeGreaterThan(0);
    expect(by['pd-6p2d/cache_aware'].modes).toEqual({ disaggregated: 60 });
    expect(report.skipped.map((s) => s.name)).toEqual([
      'pd-4p4d/cache_aware',
      'pd-6p2d/fire-and-forget',
      'both-8/conditional',
      'pd-4p4d/predicted',
      'colocated-8/cache_aware+signals',
      'both-8/predicted',
    ]);
    // the study's PD rows ran in await mode (prefill answered, then decode)
    expect(by['pd-6p2d/cache_aware'].dispatch).toBe('await');
    expect(by['colocated-8/cache_aware'].dispatch).toBe('colocated');
    for (const r of report.results) expect(Number.isFinite(r.itlP99Ms)).toBe(true);
  });
});

describe('seed 001 (groups --quick): crossing groups costs decode its first token', () => {
  it('strict keeps every transfer in its group; a cross-group transfer takes longer', { timeout: 180000 }, async () => {
    const { report } = await runGroups({ quick: true });
    const by = Object.fromEntries(report.results.map((r) => [r.policy, r]));
    expect(by.strict.crossGroupLegs).toBe(0);
    expect(by.off.crossGroupLegs).toBeGreaterThan(by.prefer.crossGroupLegs);
    // the spine gives a cross-group transfer half the link's rate (seed000 preset)
    expect(by.off.transferMsPerGBCrossGroupP50).toBeGreaterThan(by.off.transferMsPerGBInGroupP50 * 1.5);
    for (const r of report.results) expect(Number.isFinite(r.decodeFirstTokenP50Ms)).toBe(true);
    for (const r of report.results) expect(r.errors).toBe(0);
  });
});
