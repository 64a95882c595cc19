import type { Histogram } from "./types";

/** Latency buckets (seconds) of the router's histograms: 5 ms to 2 minutes. */
export const LATENCY_BOUNDS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120];

export const newHistogram = (bounds: number[] = LATENCY_BOUNDS): Histogram => ({ bounds, counts: bounds.map(() => 0), sum: 0, count: 0 });

/** Counts one observation of `ms` milliseconds. */
export function observe(h: Histogram, ms: number): void {
  const s = ms / 1000;
  const i = h.bounds.findIndex((b) => s <= b);
  if (i >= 0) h.counts[i] = (h.counts[i] ?? 0) + 1;
  h.sum += s;
  h.count += 1;
}

/** Counts one observation of a plain value (a ratio): the bounds are in its own unit. */
export function observeValue(h: Histogram, value: number): void {
  observe(h, value * 1000);
}
