// Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018), weighted.

/**
 * The most in-flight requests a node of weight `weight` may hold when it is asked to take one
 * more: ceil(loadFactor * (totalInFlight + 1) * weight / totalWeight) + slack (SPEC 5). The node
 * may take the request only while its load is below this bound. With loadFactor >= 1 the bounds
 * of a pool sum to more than its load, so some node of the pool is always under its bound. The
 * slack (`policy.loadSlack`, default 4) lets every node hold a few requests above its share, so a
 * lightly loaded cluster keeps conversations on their nodes; 0 gives the strict rule.
 * A tiny epsilon keeps float noise (e.g. 3.0000000000000004) from adding a whole slot.
 */
export function loadBound(weight: number, totalWeight: number, totalInFlight: number, loadFactor: number, slack = 0): number {
  if (!(totalWeight > 0) || !(weight > 0)) return Infinity;
  const exact = (loadFactor * (Math.max(0, totalInFlight) + 1) * weight) / totalWeight;
  return Math.max(1, Math.ceil(exact - 1e-9)) + Math.max(0, Math.floor(slack));
}

/** Whether a node with `load` in flight may take one more request under `bound`. */
export function underBound(load: number, bound: number): boolean {
  return load < bound;
}
