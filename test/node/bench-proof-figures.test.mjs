import { describe, expect, it } from 'vitest';
import { parsePrometheus, sumBy, total } from '../../bench/lib/prometheus.mjs';
import { agenticFigures, edgeQueueMs, ttftBreakdown } from '../../bench/scenarios/agentic.mjs';
import { predictionFigures, restartOption } from '../../bench/scenarios/trace.mjs';
import { prefillMsPerTokenOf, presetProfile, relearnedAfterS } from '../../bench/lib/relearn.mjs';
import { resolveModel } from '../../sim/presets.mjs';

// The figures issue 17's proof reads: the router's /metrics, the edge wait a response reports,
// where a request's time to first token went, and predicted vs reported cached tokens.

const METRICS = `# HELP pd_router_disagg_decisions_total decisions
# TYPE pd_router_disagg_decisions_total counter
pd_router_disagg_decisions_total{mode="local",reason="cached"} 12
pd_router_disagg_decisions_total{mode="disaggregated",reason="cold"} 30
pd_router_disagg_decisions_total{mode="local",reason="pinned"} 0
pd_router_prefix_predicted_tokens_total{node="n0"} 1000
pd_router_prefix_predicted_tokens_total{node="n1"} 500
pd_router_prefix_cached_tokens_total{node="n0"} 800
pd_router_prefix_cached_tokens_total{node="n1"} 500
pd_router_prefix_cache_lost_total{node="n0"} 1
pd_router_node_prefill_tokens_per_second{node="p0"} 4651.7
pd_router_node_prefill_tokens_per_second{node="d0"} 7023.2
pd_router_node_healthy{node="a \\"quoted\\" id"} 1
not a sample line
`;

describe("the router's /metrics read back", () => {
  it('parses samples with their labels (escapes included), skipping comments and junk', () => {
    const samples = parsePrometheus(METRICS);
    expect(samples).toHaveLength(11);
    expect(samples.at(-1)).toEqual({ name: 'pd_router_node_healthy', labels: { node: 'a "quoted" id' }, value: 1 });
    expect(sumBy(samples, 'pd_router_disagg_decisions_total', ['mode', 'reason'])).toEqual({ 'local/cached': 12, 'disaggregated/cold': 30, 'local/pinned': 0 });
    expect(total(samples, 'pd_router_prefix_predicted_tokens_total')).toBe(1500);
  });

  it('predicted vs reported cached tokens: over the run, and after a restart for every node and the restarted one', () => {
    const before = parsePrometheus(METRICS);
    const end = parsePrometheus(
      METRICS.replace('{node="n0"} 1000', '{node="n0"} 3000')
        .replace('cached_tokens_total{node="n0"} 800', 'cached_tokens_total{node="n0"} 1000')
        .replace('cache_lost_total{node="n0"} 1', 'cache_lost_total{node="n0"} 2'),
    );
    const f = predictionFigures(end, before, 'n0');
    expect(f).toMatchObject({ predictedTokens: 3500, reportedCachedTokens: 1500, predictedOverReported: 2.333, cacheLost: 2 });
    expect(f.afterRestart).toEqual({
      predictedTokens: 2000,
      reportedCachedTokens: 200,
      predictedOverReported: 10,
      node: { predictedTokens: 2000, reportedCachedTokens: 200, predictedOverReported: 10 },
      cacheLost: 1,
    });
    expect(predictionFigures(end, undefined, undefined)).not.toHaveProperty('afterRestart');
  });

  it('--restart NODE@SHARE', () => {
    expect(restartOption('n3@0.5')).toEqual({ node: 'n3', share: 0.5 });
    expect(restartOption(undefined)).toBeUndefined();
    expect(() => restartOption('n3')).toThrow(/NODE@SHARE/);
    expect(() => restartOption('n3@1')).toThrow(/strictly between/);
  });
});

describe('agentic: the client’s time to first token', () => {
  it('reads the edge wait from server-timing', () => {
    expect(edgeQueueMs('queue;dur=1250, route;dur=3, prefill;dur=10, decode-ttfb;dur=20')).toBe(1250);
    expect(edgeQueueMs('route;dur=3, prefill;dur=10, decode-ttfb;dur=20')).toBe(0);
    expect(edgeQueueMs(undefined)).toBe(0);
  });

  it('adds the edge wait (real ms, scaled) to the engines’ TTFT, and splits the time where it went', () => {
    const timeScale = 0.1;
    // a disaggregated request: P queued 1 s (0.4 s of it for KV), prefilled 2 s; D's first token 0.5 s after
    // a local one: queued 0.2 s at D, prefill and first token 0.8 s
    const perRequest = {
      'agentic-s0-t1-abc12345x': {
        p0: { leg: 'mooncakePrefill', promptTokens: 1000, cachedTokens: 600, queueMs: 1000, prefillMs: 2000, kvWaitMs: 400 },
        d0: { leg: 'mooncakeDecode', ttftMs: 3500, tpotMs: 10, e2eMs: 4500, outputTokens: 101, kvWaitMs: 0, queueMs: 0 },
      },
      'agentic-s0-t2-abc12345x': {
        d0: { leg: 'colocated', promptTokens: 2000, cachedTokens: 1800, ttftMs: 1000, tpotMs: 12, e2eMs: 2000, outputTokens: 81, kvWaitMs: 0, queueMs: 200 },
      },
    };
    const outcomes = [
      { id: 'agentic-s0-t1', status: 200, totalMs: 600, mode: 'disaggregated', edgeQueueMs: 50 },
      { id: 'agentic-s0-t2', status: 200, totalMs: 250, mode: 'local', edgeQueueMs: 0 },
      { id: 'agentic-s0-t3', status: 503, totalMs: 100, error: 'HTTP 503' },
    ];
    const stats = { d0: { role: 'decode', kvUsagePeak: 0.5, kvUsageMean: 0.2, preemptions: 0, requests: { total: 2 } } };
    const c = { name: 'x', config: 'pd-1p1d', protocol: 'vllm-mooncake', nodes: {}, policy: { prefill: 'cache_aware', disaggregation: 'conditional' } };
    const f = agenticFigures(c, outcomes, stats, perRequest, timeScale, parsePrometheus(METRICS), 4);
    // 50 real ms at the edge = 500 simulated ms
    expect(f.ttftP90Ms).toBe(4000);
    expect(f).toMatchObject({ completed: 2, failed: 1, notSent: 1, edgeQueued: 1, edgeQueueMaxMs: 500, modes: { disaggregated: 1, local: 1 } });
    expect(f.decisions).toEqual({ 'local/cached': 12, 'disaggregated/cold': 30 });
    // each node's learned prefill rate at the end of the run, as /metrics showed it
    expect(f.learnedPrefillTokensPerS).toEqual({ p0: 4652, d0: 7023 });
    // the prefix hit ratio of the engines that computed the prompts: P's, and D's own when alone
    expect(f.hitRatio).toBe(round4((600 + 1800) / 3000));
    expect(f.edgeWaitShare).toBe(round4(500 / (4000 + 1000)));
    // the generation time (E2E less TTFT; the edge wait, 500 ms on the first, in neither) and the
    // tokens generated, medians (nearest rank, the lower of two) of (1000, 1000) and (81, 101)
    expect(f).toMatchObject({ tpotP50Ms: 10, decodeP50Ms: 1000, outputTokensP50: 81 });
    const b = ttftBreakdown(
      outcomes.slice(0, 2),
      new Map(Object.entries({ 'agentic-s0-t1': perRequest['agentic-s0-t1-abc12345x'].d0, 'agentic-s0-t2': perRequest['agentic-s0-t2-abc12345x'].d0 })),
      new Map(Object.entries({ 'agentic-s0-t1': perRequest['agentic-s0-t1-abc12345x'].p0, 'agentic-s0-t2': perRequest['agentic-s0-t2-abc12345x'].d0 })),
      (o) => (o.edgeQueueMs ?? 0) / timeScale,
    );
    // means over the two: edge 250, queue (1000 + 200) / 2, of it KV 200, compute (2000 + 800) / 2, after P 500 / 2
    expect(b).toEqual({ edgeMs: 250, queueMs: 600, queueKvMs: 200, prefillMs: 1400, handoffMs: 250, handoffKvMs: 0, ttftMeanMs: 2500 });
    expect(b.ttftMeanMs).toBe(b.edgeMs + b.queueMs + b.prefillMs + b.handoffMs);
  });
});

/** @param {number} x */
function round4(x) {
  return Math.round(x * 10000) / 10000;
}

describe('a node made slower mid-run (agentic --slow-node)', () => {
  it('finds the first sample after the slow-down at or below the share of the rate before', () => {
    const samples = [
      { t: 8, rate: 400 },
      { t: 10, rate: 410 },
      { t: 12, rate: 300 },
      { t: 14, rate: 260 },
      { t: 16, rate: 240 },
    ];
    // 400 / sqrt 2 = 283: 300 at 12 s is above it, 260 at 14 s below
    expect(relearnedAfterS(samples, 10.5, 400, 1 / Math.SQRT2)).toBe(3.5);
    expect(relearnedAfterS(samples, 10.5, 400, 1.25 / 2)).toBe(5.5);
    // a low sample before the slow-down does not count; none low enough: null
    expect(relearnedAfterS([{ t: 5, rate: 100 }, ...samples], 10.5, 400, 0.5)).toBeNull();
  });

  it("slows a seed002 engine's prefill by the factor through the simulator's prefillMsPerToken", () => {
    const base = prefillMsPerTokenOf('seed002');
    const slowed = resolveModel({ preset: 'seed002', prefillMsPerToken: base * 2 });
    expect(slowed.cost.flopsPerMs).toBeCloseTo(resolveModel({ preset: 'seed002' }).cost.flopsPerMs / 2, -3);
  });
});

describe('agentic --profile', () => {
  it("writes the preset's prefill rate, step and link in the run's real time", () => {
    const f = resolveModel({ preset: 'seed002' });
    const p = presetProfile('seed002', 0.05);
    expect(p.prefillTokensPerS).toBeCloseTo(1000 / (prefillMsPerTokenOf('seed002') * 0.05), -1);
    expect(p.decodeStepMs).toBeCloseTo(f.cost.stepOverheadMs * 0.05, 2);
    expect(p.transferGBPerS).toBe(Math.round(f.linkBytesPerMs / 1e6 / 0.05));
  });
});
