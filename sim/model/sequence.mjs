// One request in an engine's step loop (sim/model/scheduler.mjs): its kind, its prompt's prefix
// units and token counts, the state it is in, the simulated times of its admission, first token
// and end, and the tokens it emitted, which its HTTP handler reads one by one with next().
//
// The states: `waiting` in the queue (also after a preemption), `loading` while its KV comes from
// another engine, `running` in the batch, then `finished`, `aborted` (its client left) or
// `failed` (too long for the KV memory, or its KV transfer failed).

/**
 * @typedef {{ index: number, at: number, stepMs: number }} TokenEvent
 * @typedef {'new' | 'waiting' | 'loading' | 'running' | 'finished' | 'aborted' | 'failed'} SeqState
 * @typedef {{ units: number, run: (at: number) => Promise<{ ms: number, bytes?: number, at?: number }> }} PrefixFetch
 *   `units` full prefix units (from the start) another engine holds, `run` moves them here
 */

export class Sequence {
  /**
   * @param {object} o
   * @param {'local' | 'remote' | 'prefill'} o.kind
   * @param {string[]} o.hashes the prompt's full prefix-cache units (chained hashes)
   * @param {number} o.promptTokens
   * @param {number} o.maxTokens tokens to generate (a P leg: 1)
   * @param {boolean} [o.hold] keep the blocks when finished (released by releaseHeld())
   * @param {(missingTokens: number, seq: Sequence, at: number) => Promise<{ ms: number, bytes?: number, at?: number }>} [o.load] remote: pull the
   *   missing KV, from simulated time `at` (the admitting step's); resolves with when it landed
   * @param {(seq: Sequence) => void} [o.onAdmit] told once the blocks are taken (the hit is known)
   * @param {(localUnits: number, seq: Sequence) => PrefixFetch | undefined} [o.fetchPrefix] a P leg:
   *   where a longer prefix than the local hit is held, fetch it instead of computing it
   */
  constructor(o) {
    this.kind = o.kind;
    this.hashes = o.hashes;
    this.promptTokens = Math.max(1, o.promptTokens);
    this.maxTokens = Math.max(1, o.maxTokens);
    this.hold = o.hold === true;
    this.load = o.load;
    this.onAdmit = o.onAdmit;
    this.fetchPrefix = o.fetchPrefix;
    /** prefix units fetched from another engine (0: none) */
    this.fetchedUnits = 0;
    /** @type {SeqState} */
    this.state = 'new';
    this.arrival = NaN;
    this.admittedAt = NaN;
    this.loadedAt = NaN;
    this.firstTokenAt = NaN;
    this.finishedAt = NaN;
    /** simulated ms spent waiting because its KV blocks did not fit */
    this.kvWaitMs = 0;
    /** @type {number | undefined} */
    this.kvBlockedSince = undefined;
    this.hitUnits = 0;
    this.cachedTokens = 0;
    this.loadMs = 0;
    this.preemptions = 0;
    /** tokens emitted */
    this.generated = 0;
    /** tokens to compute before the next token is emitted (a prefill's remaining part) */
    this.pending = 0;
    /** tokens whose KV is computed or received */
    this.computed = 0;
    /** @type {import('./kv-memory.mjs').Allocation | undefined} */
    this.alloc = undefined;
    /** @type {string | undefined} why it failed */
    this.error = undefined;
    /** @type {number | undefined} the HTTP status its failure maps to */
    this.errorStatus = undefined;
    /** @type {TokenEvent[]} */
    this.buffer = [];
    /** @type {((e: TokenEvent | null) => void) | undefined} */
    this.waiter = undefined;
    /** @type {(() => void) | undefined} */
    this.onAbort = undefined;
    /** @type {Promise<void>} */
    this.finished = new Promise((resolve) => (this.resolveFinished = resolve));
  }

  /** The next token, or null once the sequence ended (finished, aborted or failed). @returns {Promise<TokenEvent | null>} */
  next() {
    const e = this.buffer.shift();
    if (e) return Promise.resolve(e);
    if (this.ended) return Promise.resolve(null);
    return new Promise((resolve) => (this.waiter = resolve));
  }

  get ended() {
    return this.state === 'finished' || this.state === 'aborted' || this.state === 'failed';
  }

  /** Stop it (the client left): its blocks are freed at once. */
  abort() {
    if (this.ended) return;
    this.onAbort?.();
  }

  /** @param {TokenEvent} e */
  emit(e) {
    if (this.waiter) {
      const w = this.waiter;
      this.waiter = undefined;
      w(e);
    } else this.buffer.push(e);
  }

  /** @param {SeqState} state */
  end(state) {
    this.state = state;
    if (this.waiter) {
      const w = this.waiter;
      this.waiter = undefined;
      w(null);
    }
    /** @type {() => void} */ (this.resolveFinished)();
  }
}
