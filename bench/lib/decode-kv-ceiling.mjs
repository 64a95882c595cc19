// The most decode KV a closed-loop replay of a trace can hold (seed 002's decode KV wall, issue 22).
//
// vLLM counts KV use as the blocks requests hold: a finished request's cached blocks are free
// (vllm/v1/core/block_pool.py get_usage, over the free block queue), and a decode leg holds its
// blocks from its scheduling (WAITING_FOR_REMOTE_KVS while the KV arrives) to its last token.
// With at most `inflight` sessions at once and a session's turns one after the other, the decode
// nodes never hold more than the requests of those sessions. The ceiling is that replay with
// nothing but decoding: every request holds its prompt and output from the moment its session's
// previous turn ended for output x `tpotMs`, with no prefill, transfer, tool or router time (each
// of which only spaces the decodes out). A run's decode KV mean above it means KV held by
// something other than the trace's requests in flight.

/**
 * @typedef {{ session: number, input_length: number, output_length: number }} CeilingRequest
 * @typedef {{ mean: number, peak: number, spanS: number }} DecodeKvCeiling
 *   mean: time-weighted over the replay's span; peak: at the busiest instant; both as a share of
 *   `capacityTokens` (all decode nodes together)
 */

/**
 * @param {CeilingRequest[]} trace in session-arrival order, a session's turns in order
 * @param {{ inflight: number, tpotMs: number, capacityTokens: number }} o inflight 0: no cap
 * @returns {DecodeKvCeiling}
 */
export function decodeKvCeiling(trace, { inflight, tpotMs, capacityTokens }) {
  /** @type {Map<number, CeilingRequest[]>} */
  const sessions = new Map();
  for (const r of trace) {
    const turns = sessions.get(r.session);
    if (turns) turns.push(r);
    else sessions.set(r.session, [r]);
  }
  const slots = new Array(inflight > 0 ? inflight : sessions.size).fill(0);
  /** @type {[number, number][]} (time ms, tokens taken or given back) */
  const changes = [];
  let area = 0;
  let end = 0;
  for (const turns of sessions.values()) {
    // the session starts when the earliest slot frees
    const slot = slots.indexOf(Math.min(...slots));
    let t = slots[slot];
    for (const r of turns) {
      const tokens = r.input_length + r.output_length;
      const ms = r.output_length * tpotMs;
      changes.push([t, tokens], [t + ms, -tokens]);
      area += tokens * ms;
      t += ms;
    }
    slots[slot] = t;
    end = Math.max(end, t);
  }
  // a request that ends at the instant another starts has given its blocks back first
  changes.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  let held = 0;
  let peak = 0;
  for (const [, d] of changes) {
    held += d;
    peak = Math.max(peak, held);
  }
  return { mean: end > 0 ? area / end / capacityTokens : 0, peak: peak / capacityTokens, spanS: end / 1000 };
}
