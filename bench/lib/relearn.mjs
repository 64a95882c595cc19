// A node made slower mid-run, and how soon the router's learned rate shows it (issue 23 proof: "the
// rates re-learned within a minute after a node is made twice as slow mid-run"). The engine's
// prefill is slowed through the simulator's control API (its FLOP rate divided by `factor`: every
// prefill token, linear and attention, costs `factor` times as much); the router's learned rate is
// read from /metrics (`pd_router_node_prefill_tokens_per_second{node}`) every `sampleS` real seconds.
import { setTimeout as sleep } from 'node:timers/promises';
import { resolveModel } from '../../sim/presets.mjs';
import { routerMetrics } from './prometheus.mjs';

const RATE = 'pd_router_node_prefill_tokens_per_second';

/**
 * The linear prefill cost a token of a preset, ms (the simulator's `prefillMsPerToken` option).
 * @param {string} preset
 */
export function prefillMsPerTokenOf(preset) {
  const { cost } = resolveModel({ preset });
  return cost.linearFlopsPerToken / cost.flopsPerMs;
}

/**
 * A document `profile` (SPEC 9: the prior of the learned rates) from a preset's public figures, in
 * the real time of a run at `timeScale` (real ms a simulated ms): its linear prefill rate, its decode
 * step's fixed part and its link. What an operator would write from the hardware's specs.
 * @param {string} preset @param {number} timeScale
 */
export function presetProfile(preset, timeScale) {
  const f = resolveModel({ preset });
  return {
    prefillTokensPerS: Math.round(1000 / (prefillMsPerTokenOf(preset) * timeScale)),
    decodeStepMs: Math.max(0.01, Math.round(f.cost.stepOverheadMs * timeScale * 100) / 100),
    transferGBPerS: Math.round(f.linkBytesPerMs / 1e6 / timeScale),
  };
}

/**
 * When the learned rate has come down to `share` of what it was before the slow-down: the first
 * sample after `slowedAt` at or below it, as seconds after `slowedAt`; null when none did.
 * @param {{ t: number, rate: number }[]} samples t: real seconds from the start
 * @param {number} slowedAt @param {number} before @param {number} share
 */
export function relearnedAfterS(samples, slowedAt, before, share) {
  const hit = samples.find((s) => s.t >= slowedAt && s.rate <= before * share);
  return hit ? Math.round((hit.t - slowedAt) * 10) / 10 : null;
}

/**
 * Watches one node's learned prefill rate for a run and slows its engine `slowAtS` real seconds in.
 * `stop()` ends the watch and returns the figures: the rate before (mean of the samples of the 10 s
 * before the slow-down), when it came down to 1 / sqrt(factor) of that (half way, geometrically, to
 * the new rate) and to 1.25 / factor of it, and the samples.
 * @param {{ routerUrl: string, controlUrl: string, node: string, preset: string, factor: number, slowAtS: number, sampleS?: number }} o
 */
export function watchRelearn({ routerUrl, controlUrl, node, preset, factor, slowAtS, sampleS = 2 }) {
  const t0 = performance.now();
  const now = () => (performance.now() - t0) / 1000;
  /** @type {{ t: number, rate: number }[]} */
  const samples = [];
  let slowedAt = /** @type {number | null} */ (null);
  let running = true;
  const loop = (async () => {
    while (running) {
      if (slowedAt === null && now() >= slowAtS) {
        const res = await fetch(`${controlUrl}/engines/${node}/options`, { method: 'POST', body: JSON.stringify({ prefillMsPerToken: prefillMsPerTokenOf(preset) * factor }) });
        if (!res.ok) throw new Error(`slowing ${node}: ${res.status} ${await res.text()}`);
        slowedAt = now();
      }
      try {
        const rate = (await routerMetrics(routerUrl)).find((s) => s.name === RATE && s.labels.node === node)?.value;
        if (rate !== undefined && Number.isFinite(rate)) samples.push({ t: Math.round(now() * 10) / 10, rate });
      } catch {
        // a missed sample (the router busy): the next one counts
      }
      await sleep(sampleS * 1000);
    }
  })();
  return {
    async stop() {
      running = false;
      await loop;
      if (slowedAt === null) return { node, factor, slowedAtS: null, note: 'the run ended before the slow-down' };
      const at = slowedAt;
      const pre = samples.filter((s) => s.t < at && s.t >= at - 10);
      const before = pre.length ? pre.reduce((a, s) => a + s.rate, 0) / pre.length : Number.NaN;
      return {
        node,
        factor,
        slowedAtS: Math.round(at * 10) / 10,
        rateBefore: Math.round(before),
        halfWayS: relearnedAfterS(samples, at, before, 1 / Math.sqrt(factor)),
        learnedS: relearnedAfterS(samples, at, before, 1.25 / factor),
        rateAtEnd: samples.at(-1)?.rate ?? null,
        samples,
      };
    },
  };
}
