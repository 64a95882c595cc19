// One simulated clock for the engines of a cluster: simulated milliseconds, paced against real
// time by `timeScale` (real ms per simulated ms). Every engine's step loop, every KV transfer and
// every wait runs on it, so the engines of one cluster agree on what "now" is.
//
// timeScale > 0: an event due at simulated time t fires when real time reaches origin + t x
//   timeScale. An event that fires late (a busy event loop) still carries its own time t, so step
//   lengths stay exact in simulated time; only the pacing slips, and it catches up.
// timeScale 0: no pacing at all; events run in time order as fast as the event loop allows and the
//   clock jumps from one to the next (a discrete-event simulation).

/**
 * @typedef {{ cancel: () => void }} Scheduled
 */

export class SimClock {
  /** @param {number} timeScale real ms per simulated ms, >= 0 */
  constructor(timeScale) {
    if (!(timeScale >= 0)) throw new RangeError('timeScale must be >= 0');
    this.timeScale = timeScale;
    this.origin = performance.now();
    /** the latest simulated time an event fired at */
    this.fired = 0;
    /** timeScale 0: pending events, kept sorted by time then insertion */
    /** @type {{ t: number, seq: number, fn: (t: number) => void, cancelled: boolean }[]} */
    this.queue = [];
    this.seq = 0;
    this.draining = false;
    this.closed = false;
  }

  /** Simulated ms now. */
  now() {
    if (this.timeScale === 0) return this.fired;
    return Math.max(this.fired, (performance.now() - this.origin) / this.timeScale);
  }

  /**
   * Run `fn(t)` at simulated time `t` (at once when t is past).
   * @param {number} t @param {(t: number) => void} fn @returns {Scheduled}
   */
  at(t, fn) {
    if (this.timeScale === 0) {
      const entry = { t, seq: this.seq++, fn, cancelled: false };
      // insertion keeps the queue sorted; queues stay short (a few events per engine)
      let i = this.queue.length;
      while (i > 0 && (this.queue[i - 1].t > t || (this.queue[i - 1].t === t && this.queue[i - 1].seq > entry.seq))) i--;
      this.queue.splice(i, 0, entry);
      this.#drainSoon();
      return { cancel: () => void (entry.cancelled = true) };
    }
    let cancelled = false;
    const fire = () => {
      if (cancelled || this.closed) return;
      if (t > this.fired) this.fired = t;
      fn(t);
    };
    const delay = this.origin + t * this.timeScale - performance.now();
    // below a millisecond a timer would round up to one: yield instead, and let later events
    // (due after real time has caught up) be paced by real timers
    if (delay < 1) {
      const h = setImmediate(fire);
      return { cancel: () => ((cancelled = true), clearImmediate(h)) };
    }
    const h = setTimeout(fire, delay);
    return { cancel: () => ((cancelled = true), clearTimeout(h)) };
  }

  /** Resolves `ms` simulated milliseconds from now. @param {number} ms */
  sleep(ms) {
    return new Promise((resolve) => this.at(this.now() + Math.max(0, ms), () => resolve(undefined)));
  }

  /** Stop firing events (the cluster is closing). */
  close() {
    this.closed = true;
    this.queue.length = 0;
  }

  #drainSoon() {
    if (this.draining || this.closed) return;
    this.draining = true;
    // one event per macrotask, so HTTP I/O interleaves with the simulation
    setImmediate(() => {
      this.draining = false;
      const entry = this.queue.shift();
      if (entry && !entry.cancelled && !this.closed) {
        if (entry.t > this.fired) this.fired = entry.t;
        entry.fn(entry.t);
      }
      if (this.queue.length > 0) this.#drainSoon();
    });
  }
}
