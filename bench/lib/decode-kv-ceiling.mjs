// The most decode KV a closed-loop replay of a trace can hold (seed 002's decode KV wall, issue 22).
//
// vLLM counts KV use as the blocks requests hold: a finished request's cached blocks are free
// (vllm/v1/core/block_pool.py get_usage, over the free block queue), and a decode leg holds its
// blocks from its scheduling (WAITING_FOR_REMOTE_KVS while the KV arrives) to its last token.
// With at most `inflight` sessions at once and a session's turns one after the other, whatever the
// engines and the router do:
// - the KV-time the decode nodes hold is at most every request's prompt and output for its whole
//   decode (output x `tpotMs`);
// - the replay lasts at least its longest session's decodes, and at least all decodes spread over
//   the slots;
// - at one instant they hold at most one request from each of `inflight` sessions.
// A run's decode KV above that means KV held by something other than the trace's requests.

/**
 * @typedef {{ session: number, input_length: number, output_length: number }} CeilingRequest
 * @typedef {{ mean: number, peak: number, spanS: number }} DecodeKvCeiling
 *   mean: time-weighted over the shortest span the replay can take; peak: the largest request of
 *   each of the `inflight` biggest sessions at once; both as a share of `capacityTokens`
 */

/**
 * @param {CeilingRequest[]} trace
 * @param {{ inflight: number, tpotMs: number, capacityTokens: number }} o inflight 0: no cap
 * @returns {DecodeKvCeiling}
 */
export function decodeKvCeiling(trace, { inflight, tpotMs, capacityTokens }) {
  /** @type {Map<number, { ms: number, largest: number }>} */
  const sessions = new Map();
  let area = 0;
  let decodeMs = 0;
  for (const r of trace) {
    const tokens = r.input_length + r.output_length;
    const ms = r.output_length * tpotMs;
    area += tokens * ms;
    decodeMs += ms;
    const s = sessions.get(r.session) ?? { ms: 0, largest: 0 };
    s.ms += ms;
    s.largest = Math.max(s.largest, tokens);
    sessions.set(r.session, s);
  }
  const slots = inflight > 0 ? Math.min(inflight, sessions.size) : sessions.size;
  const all = [...sessions.values()];
  const spanMs = Math.max(decodeMs / Math.max(1, slots), ...all.map((s) => s.ms));
  const peakTokens = all
    .map((s) => s.largest)
    .sort((a, b) => b - a)
    .slice(0, slots)
    .reduce((a, n) => a + n, 0);
  return { mean: spanMs > 0 ? area / spanMs / capacityTokens : 0, peak: peakTokens / capacityTokens, spanS: spanMs / 1000 };
}
