// `npm run bench -- soak --target baseline` (issue 25 item 1: the router's memory against the
// pass-through Worker's under the same traffic) never finished a run twice: a closed loop of
// clients leaving before any answer byte piled legs up on P without bound (local workerd never
// tells a Worker such a client left), and the forced GC at the end waited for ever on the idle
// baseline isolate (workerd hands an isolate its inspector messages when it runs). A short paced
// run through the baseline must end, every kind of request must have been sent and ended, and
// the engines must be idle after it.
import { describe, expect, it } from 'vitest';
import { runSoak } from '../../bench/scenarios/soak.mjs';

describe('bench soak through the pass-through baseline Worker', () => {
  it('a paced run of departures ends, with its heap read after forced GC at the end', async () => {
    const { report } = await runSoak({ target: 'baseline', minutes: '0.1', rate: '20', concurrency: '8', 'sample-s': '1' });
    expect(report.target).toBe('baseline');
    // 6 s at 20 a second: request n starts at n / 20 s
    expect(report.requests).toBe(120);
    const ended = Object.values(report.outcomes).flatMap((o) => Object.entries(o));
    expect(ended.reduce((n, [, k]) => n + k, 0)).toBe(120);
    expect(ended.filter(([how]) => how === 'timed-out')).toEqual([]);
    for (const kind of ['complete', 'mid-stream', 'early', 'whole']) expect(Object.keys(report.outcomes[kind]).length, kind).toBeGreaterThan(0);
    // the last reading: after the clients, through the inspector of the idle isolate
    expect(report.rssMb.afterGc.length).toBeGreaterThanOrEqual(2);
    expect(report.heap.endBytes).toBeGreaterThan(0);
    expect(Number.isFinite(report.idleAfterMs)).toBe(true);
  }, 90_000);
});
