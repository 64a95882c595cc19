// Small statistics over samples: percentiles (nearest rank), means, max/mean balance.

/**
 * Nearest-rank percentile: the smallest sample with at least p% of the samples at or below it.
 * @param {number[]} samples
 * @param {number} p in [0, 100]
 * @returns {number} NaN when there are no samples
 */
export function percentile(samples, p) {
  if (!(p >= 0 && p <= 100)) throw new RangeError('p must be in [0, 100]');
  if (samples.length === 0) return NaN;
  const sorted = Float64Array.from(samples).sort();
  const rank = Math.max(1, Math.ceil((p / 100) * sorted.length));
  return sorted[rank - 1];
}

/** @param {number[]} values */
export function mean(values) {
  return values.length === 0 ? NaN : values.reduce((a, b) => a + b, 0) / values.length;
}

/**
 * Load balance: the busiest node's count over the mean count (1 = perfectly even).
 * @param {number[]} counts one per node, idle nodes included
 */
export function maxOverMean(counts) {
  const m = mean(counts);
  return m > 0 ? Math.max(...counts) / m : NaN;
}

/** @param {number} x @param {number} [digits] */
export function round(x, digits = 3) {
  if (!Number.isFinite(x)) return x;
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

/**
 * a / b rounded, NaN when either is not a finite number or b is 0 (a ratio "vs baseline").
 * @param {number} a @param {number} b @param {number} [digits]
 */
export function ratio(a, b, digits = 2) {
  if (!Number.isFinite(a) || !Number.isFinite(b) || b === 0) return NaN;
  return round(a / b, digits);
}

/**
 * Milliseconds after `start` at which a falling count first reached each threshold, from
 * samples [{ atMs, value }] (e.g. upstream legs still open, polled after the clients left).
 * @param {{ atMs: number, value: number }[]} samples in time order
 * @param {number} start
 * @returns {{ halfMs: number, allMs: number }} NaN when never reached
 */
export function drainTimes(samples, start) {
  const initial = samples.length ? Math.max(...samples.map((s) => s.value)) : 0;
  const when = (/** @type {(v: number) => boolean} */ test) => {
    const hit = samples.find((s) => test(s.value));
    return hit ? round(hit.atMs - start, 0) : NaN;
  };
  return { halfMs: when((v) => v <= initial / 2), allMs: when((v) => v === 0) };
}
