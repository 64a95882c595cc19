// One simulated clock for the engines of a cluster: simulated milliseconds, paced against real
// time by `timeScale` (real ms per simulated ms). Every engine's step loop, every KV transfer and
// every wait runs on it, so the engines of one cluster agree on what "now" is.
//
// timeScale > 0: an event due at simulated time t fires when real time reaches origin + t x
//   timeScale. An event that fires late (a busy event loop) still carries its own time t, so step
//   lengths stay exact in simulated time; only the pacing slips, and it catches up.
// timeScale 0: no pacing at all; events run in time order as fast as the event loop allows and the
//   clock jumps from one to the next (a discrete-event simulation).
//
// hold() / release() stop the paced clock and start it again (counted: it runs when every hold is
// released). While held, simulated time does not pass and no event fires; on release the clock goes
// on from where it stopped, every pending event as far ahead as it was. The benchmark holds it
// while the router, not an engine, has a request in hand (sim/model/router-holds.mjs): the
// router's real time, which a busy machine stretches, is then not simulated time the engines see.

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
    /** open holds; the clock stands while there is one */
    this.holds = 0;
    /** real time the current hold began */
    this.heldAt = 0;
    /** real ms the clock has stood in all */
    this.heldRealMs = 0;
    /** events due while the clock stood, armed again on release */
    /** @type {{ t: number, fn: (t: number) => void, cancelled: boolean, handle?: ReturnType<typeof setTimeout> | ReturnType<typeof setImmediate>, immediate?: boolean }[]} */
    this.deferred = [];
  }

  /** Stop simulated time until the matching release(). Paced clocks only (timeScale > 0). */
  hold() {
    if (this.timeScale === 0 || this.closed) return;
    if (this.holds++ === 0) this.heldAt = performance.now();
  }

  /** Release a hold: with none left, time goes on from where it stood. */
  release() {
    if (this.timeScale === 0 || this.holds === 0) return;
    if (--this.holds > 0) return;
    const stood = performance.now() - this.heldAt;
    this.origin += stood;
    this.heldRealMs += stood;
    const due = this.deferred.sort((a, b) => a.t - b.t);
    this.deferred = [];
    for (const entry of due) if (!entry.cancelled) this.#arm(entry);
  }

  /** Simulated ms now. */
  now() {
    if (this.timeScale === 0) return this.fired;
    const real = this.holds > 0 ? this.heldAt : performance.now();
    return Math.max(this.fired, (real - this.origin) / this.timeScale);
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
    const entry = { t, fn, cancelled: false };
    this.#arm(entry);
    return {
      cancel: () => {
        entry.cancelled = true;
        if (entry.handle !== undefined) (entry.immediate ? clearImmediate : clearTimeout)(/** @type {any} */ (entry.handle));
      },
    };
  }

  /**
   * Fire a paced event when real time reaches it; while the clock stands, keep it for release().
   * @param {{ t: number, fn: (t: number) => void, cancelled: boolean, handle?: any, immediate?: boolean }} entry
   */
  #arm(entry) {
    if (this.holds > 0) {
      entry.handle = undefined;
      this.deferred.push(entry);
      return;
    }
    const fire = () => {
      entry.handle = undefined;
      if (entry.cancelled || this.closed) return;
      // the clock stood (or stands) since this was armed: it is due later in real time
      if (this.holds > 0 || this.origin + entry.t * this.timeScale - performance.now() >= 1) return this.#arm(entry);
      if (entry.t > this.fired) this.fired = entry.t;
      entry.fn(entry.t);
    };
    const delay = this.origin + entry.t * this.timeScale - performance.now();
    // below a millisecond a timer would round up to one: yield instead, and let later events
    // (due after real time has caught up) be paced by real timers
    entry.immediate = delay < 1;
    entry.handle = entry.immediate ? setImmediate(fire) : setTimeout(fire, delay);
  }

  /** Resolves `ms` simulated milliseconds from now. @param {number} ms */
  sleep(ms) {
    return new Promise((resolve) => this.at(this.now() + Math.max(0, ms), () => resolve(undefined)));
  }

  /** Stop firing events (the cluster is closing). */
  close() {
    this.closed = true;
    this.queue.length = 0;
    this.deferred.length = 0;
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
