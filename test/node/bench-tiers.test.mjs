// The `tiers` scenario's pure parts (bench/scenarios/tiers.mjs): the max-min fair split the keys'
// admitted shares are judged against, the per-tier figures, the goals and the tables. No servers.
import { describe, expect, it } from 'vitest';
import { byTier, clearRefusal, fairCounts, maxMinFair, tiersFigures, tiersTable } from '../../bench/scenarios/tiers.mjs';

/** @param {string} key @param {'priority' | 'default' | 'flex'} tier @param {number} status @param {Record<string, unknown>} [extra] */
const outcome = (key, tier, status, extra = {}) => ({
  phase: 'o',
  id: `x${key}${tier}${status}`,
  key,
  tier,
  sentAtMs: 0,
  sentEpochMs: 0,
  status,
  ...(status === 503 ? { code: 'cluster_busy' } : status === 429 ? { code: 'fair_share_exceeded' } : {}),
  ttftMs: 100,
  totalMs: 500,
  edgeMs: 0,
  complete: status === 200,
  ...extra,
});
const times = (/** @type {number} */ n, /** @type {() => any} */ make) => Array.from({ length: n }, make);

describe('max-min fairness', () => {
  it('a key gets at most its demand; what it leaves is shared evenly by the others', () => {
    // 0.6 of capacity over demands 0.5 / 0.25 / 0.15 / 0.1: k4 and k3 fully, k1 and k2 0.175 each
    const fair = maxMinFair(60, { k1: 50, k2: 25, k3: 15, k4: 10 });
    expect(fair).toEqual({ k1: 17.5, k2: 17.5, k3: 15, k4: 10 });
  });

  it('enough for everyone: each its demand; nothing to give: 0; a key with no demand gets 0', () => {
    expect(maxMinFair(100, { a: 3, b: 4 })).toEqual({ a: 3, b: 4 });
    expect(maxMinFair(0, { a: 3, b: 4 })).toEqual({ a: 0, b: 0 });
    expect(maxMinFair(10, { a: 0, b: 30 })).toEqual({ a: 0, b: 10 });
  });

  it('never gives more than the capacity, nor a key more than it asked (property over a grid)', () => {
    for (const capacity of [0, 1, 7, 20, 55, 100]) {
      for (const demands of [
        { a: 1, b: 2, c: 3 },
        { a: 50, b: 50 },
        { a: 9, b: 0, c: 40, d: 2 },
      ]) {
        const fair = maxMinFair(capacity, demands);
        const given = Object.values(fair).reduce((x, y) => x + y, 0);
        expect(given).toBeLessThanOrEqual(capacity + 1e-9);
        expect(given).toBeCloseTo(
          Math.min(
            capacity,
            Object.values(demands).reduce((x, y) => x + y, 0),
          ),
          9,
        );
        for (const [k, v] of Object.entries(fair)) expect(v).toBeLessThanOrEqual(/** @type {any} */ (demands)[k]);
      }
    }
  });
});

describe("each key's fair count", () => {
  it('is split tier by tier: what a tier admitted, max-min over the keys that asked in it', () => {
    const outcomes = [
      // priority: all admitted (k1 3, k2 1)
      ...times(3, () => outcome('k1', 'priority', 200)),
      outcome('k2', 'priority', 200),
      // default: 4 admitted of k1's 6 and k2's 2 -> fair 2 / 2; k1 got 3, k2 1
      ...times(3, () => outcome('k1', 'default', 200)),
      ...times(3, () => outcome('k1', 'default', 503)),
      outcome('k2', 'default', 200),
      outcome('k2', 'default', 429),
    ];
    const [k1, k2] = fairCounts(outcomes, ['k1', 'k2']);
    expect(k1).toMatchObject({ key: 'k1', arrived: 9, admitted: 6, fair: 5, deviation: 0.2 });
    expect(k2).toMatchObject({ key: 'k2', arrived: 3, admitted: 2, fair: 3, deviation: -0.333 });
    expect(k1.admittedShare + k2.admittedShare).toBeCloseTo(1, 3);
    expect(k1.fairShare + k2.fairShare).toBeCloseTo(1, 3);
  });
});

describe('per tier and the goals', () => {
  it('a refusal with its code is clear; a 200 cut short, a 502 or a dropped connection is lost', () => {
    expect(clearRefusal(/** @type {any} */ (outcome('k1', 'flex', 503)))).toBe(true);
    expect(clearRefusal(/** @type {any} */ (outcome('k1', 'flex', 429)))).toBe(true);
    expect(clearRefusal(/** @type {any} */ (outcome('k1', 'flex', 502)))).toBe(false);
    const tiers = byTier(/** @type {any} */ ([outcome('k1', 'flex', 503), outcome('k1', 'flex', 200, { complete: false }), outcome('k1', 'flex', 0), outcome('k1', 'flex', 200)]));
    expect(tiers.flex).toMatchObject({ arrived: 4, admitted: 1, refused: { '503 cluster_busy': 1 }, refusedShare: 0.25, lost: 2 });
  });

  it('the report says which goal is met, and the table shows each figure', () => {
    const unloaded = [...times(10, () => outcome('k1', 'priority', 200, { phase: 'u', ttftMs: 100 })), outcome('k2', 'default', 200, { phase: 'u' })];
    const overload = [
      ...times(10, () => outcome('k1', 'priority', 200, { ttftMs: 140, edgeMs: 20 })),
      ...times(4, () => outcome('k1', 'default', 200)),
      ...times(4, () => outcome('k2', 'default', 200)),
      ...times(4, () => outcome('k1', 'default', 503)),
      ...times(5, () => outcome('k2', 'flex', 503)),
    ];
    const upstream = { legs: 36, requestsReached: 18, admitted: 18, legsOfRefused: 0, legsBeforeWaitEnded: 0, legsTimed: 36 };
    const r = tiersFigures({
      s: { probeConcurrency: 8, probeSeconds: 10, load: 2, unloadedLoad: 0.2 },
      probe: [outcome('k1', 'default', 200)],
      sustainable: 5,
      unloaded,
      overload,
      upstream,
      drained: 100,
      rejectedBefore: { 'timeout/default': 1 },
      rejectedAfter: { 'timeout/default': 5, 'shed/flex': 5 },
    });
    expect(r.goals.priorityTtftP90).toMatchObject({ unloadedMs: 100, overloadMs: 140, ratio: 1.4, met: true });
    expect(r.goals.flexShedFirst).toEqual({ refusedShare: { priority: 0, default: 0.333, flex: 1 }, met: true });
    expect(r.goals.lost).toEqual({ count: 0, met: true });
    expect(r.goals.nothingHeldUpstream.met).toBe(true);
    expect(r.overload.rejectedByReason).toEqual({ 'timeout/default': 4, 'shed/flex': 5 });
    const table = tiersTable(r);
    expect(table).toContain('| priority TTFT p90 overloaded / unloaded <= 1.5 | 140 / 100 ms = 1.4 | yes |');
    expect(table).toContain('| overload | 10 | 27 | flex | 5 | 0 | 503 cluster_busy 5 (1) |');
    expect(table).toContain('timeout/default 4, shed/flex 5');
    // a request of a refused tier that reached an engine: the goal is not met
    expect(
      tiersFigures({ ...{ s: {}, probe: [], sustainable: 5, unloaded, overload, drained: 1, rejectedBefore: {}, rejectedAfter: {} }, upstream: { ...upstream, legsOfRefused: 1 } })
        .goals.nothingHeldUpstream.met,
    ).toBe(false);
  });
});
