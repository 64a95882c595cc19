// How the alarm's fan-outs are spread: a slice of the nodes a sub-tick (src/state/node-slices.ts).

/** A sub-tick is at least this long: spreading finer gains nothing and costs an alarm run each. */
export const MIN_SUBTICK_MS = 1_000;
/** A job over more nodes than this is split into slices, one a sub-tick: two rounds of the six connection slots. */
export const SLICE_NODES = 12;

/**
 * How many slices (one a sub-tick) a job over `nodes` nodes with period `periodMs` is spread into,
 * so its fetches do not leave in one burst and each alarm run sends a bounded number.
 */
export function slicesFor(nodes: number, periodMs: number): number {
  return Math.max(1, Math.min(Math.ceil(nodes / SLICE_NODES), Math.floor(periodMs / MIN_SUBTICK_MS)));
}
