import { describe, expect, it } from 'vitest';
import { countKinds, failureKind } from '../../bench/lib/failures.mjs';
import { parseProcStat } from '../../bench/lib/proc.mjs';
import { drainTimes, ratio } from '../../bench/lib/stats.mjs';
import { enginesOf, headline, levelRatios, overheadTables, pathFigures, targetPolicy } from '../../bench/scenarios/overhead.mjs';

const HUNG =
  "The Workers runtime canceled this request because it detected that your Worker's code had hung and would never generate a response. Refer to: https://developers.cloudflare.com/workers/observability/errors/";

describe('failed requests are counted by kind', () => {
  it('passes a 2xx with a clean end, and names every other outcome', () => {
    expect(failureKind({ status: 200 })).toBeNull();
    expect(failureKind({ status: 500, error: `non-JSON answer: ${HUNG}` })).toBe('500 runtime canceled: code had hung');
    expect(failureKind({ status: 502, json: { error: { message: 'The decode node failed.', code: 'upstream_unavailable' } } })).toBe('502 upstream_unavailable');
    expect(failureKind({ status: 200, error: 'response ended early' })).toBe('200 broken stream: response ended early');
    expect(failureKind({ status: 0, error: 'connect ECONNREFUSED 127.0.0.1:4312' })).toBe('transport: connect ECONNREFUSED N.N.N.N:N');
    expect(failureKind({ status: 503 })).toBe('503');
  });
  it('tallies kinds, most frequent first', () => {
    expect(countKinds([null, 'b', 'a', 'b', null])).toEqual([
      { kind: 'b', count: 2 },
      { kind: 'a', count: 1 },
    ]);
    expect(countKinds([null])).toEqual([]);
  });
});

describe('/proc figures', () => {
  it('reads utime, stime and the process group of a stat line whose command has spaces', () => {
    const line = '4242 (work erd) S 1 4200 4200 0 -1 4194560 100 0 0 0 1234 56 0 0 20 0 9 0 100 0 0';
    expect(parseProcStat(line)).toEqual({ comm: 'work erd', pgid: 4200, utime: 1234, stime: 56 });
  });
});

describe('ratios and drain times', () => {
  it('is NaN rather than Infinity when the baseline is 0 or missing', () => {
    expect(ratio(3, 1.5)).toBe(2);
    expect(ratio(1, 0)).toBeNaN();
    expect(ratio(NaN, 2)).toBeNaN();
  });
  it('finds when a falling count reached half and zero', () => {
    const samples = [
      { atMs: 1000, value: 10 },
      { atMs: 1020, value: 8 },
      { atMs: 1040, value: 5 },
      { atMs: 1060, value: 0 },
    ];
    expect(drainTimes(samples, 1000)).toEqual({ halfMs: 40, allMs: 60 });
    expect(drainTimes([{ atMs: 5, value: 3 }], 0).allMs).toBeNaN();
  });
});

describe('overhead report shape', () => {
  const samples = (ttfb, cpuMs, kinds = []) => ({ ttfb, kinds: [...ttfb.map(() => null), ...kinds], ms: 1000, cpuMs, sent: ttfb.length + kinds.length });
  const direct = samples([1, 2, 3, 4], 0);
  const base = pathFigures(samples([2, 3, 4, 5], 4), direct);
  const router = pathFigures(samples([3, 4, 5, 6], 12, ['500 runtime canceled: code had hung']), direct);
  const d = pathFigures(direct, null);
  const ratios = levelRatios(router, base, d);

  it('gives added TTFB against direct and CPU per request sent', () => {
    expect(base).toMatchObject({ requests: 4, ttfbP50Ms: 3, addedTtfbP50Ms: 1, addedTtfbP99Ms: 1, reqPerS: 4, cpuMsPerRequest: 1, failed: 0 });
    expect(router).toMatchObject({ requests: 5, addedTtfbP50Ms: 2, cpuMsPerRequest: 2.4, failed: 1, failures: [{ kind: '500 runtime canceled: code had hung', count: 1 }] });
    expect(d).not.toHaveProperty('cpuMsPerRequest');
    expect(ratios).toMatchObject({ addedTtfbP50VsBaseline: 2, cpuVsBaseline: 2.4, reqPerSVsBaseline: 1 });
  });

  it('has camelCase figures per policy and one table a subject', () => {
    const levels = [{ concurrency: 16, direct: d, baseline: base, router, ratios }];
    expect(headline(levels)).toEqual({
      addedTtfbP50MsAt16: 2,
      addedTtfbP99MsAt16: 2,
      reqPerSAt16: 4,
      cpuMsPerRequestAt16: 2.4,
      cpuVsBaselineAt16: 2.4,
      addedTtfbP50VsBaselineAt16: 2,
      failedAt16: 1,
    });
    const table = overheadTables({
      results: [{ policy: 'round_robin', levels }],
      memory: [
        {
          target: 'baseline',
          streamsOpen: 10,
          streamsAsked: 10,
          rssBeforeKb: 1,
          rssPeakKb: 2,
          kbPerStream: 100,
          upstreamClosedHalfMs: 10,
          upstreamClosedAllMs: 20,
          upstreamStillOpen: 0,
        },
      ],
    });
    expect(table).toContain('| round_robin | 16 | 1 / 2 (2x) |');
    expect(table).toContain('| round_robin | 16 | router | 500 runtime canceled: code had hung | 1 |');
    expect(table).toContain('| baseline | 10 (10) | 1 | 2 | 100 | 10 / 20 | 0 |');
  });
});

describe('overhead at many nodes, per disaggregation', () => {
  it('--nodes N gives N/2 P and N/2 D; a target names a policy and, after a slash, the disaggregation', () => {
    const engines = enginesOf(64);
    expect(engines.filter((e) => e.role === 'prefill').map((e) => e.id)).toEqual(Array.from({ length: 32 }, (_, i) => `p${i}`));
    expect(engines.filter((e) => e.role === 'decode')).toHaveLength(32);
    expect(enginesOf(4).map((e) => e.id)).toEqual(['p0', 'p1', 'd0', 'd1']);
    expect(targetPolicy('cache_aware/predicted')).toEqual({ prefill: 'cache_aware', decode: 'cache_aware', disaggregation: 'predicted' });
    expect(targetPolicy('round_robin')).toEqual({ prefill: 'round_robin', decode: 'round_robin' });
    expect(() => targetPolicy('cache_aware/sometimes')).toThrow(/unknown disaggregation sometimes/);
    expect(() => targetPolicy('fastest')).toThrow(/unknown fastest/);
  });
});
