// The router's own time, kept out of simulated time. The engines run on a paced clock (real ms =
// simulated ms x timeScale) and the router in real time, so every real millisecond the router
// spends between a client and an engine is 1 / timeScale simulated ones: at time scale 0.04 a
// 20 ms hand-off is 0.5 simulated s, and on a busy machine, where the Worker gets less of the CPU,
// several seconds a request. In a closed loop (a session's next turn waits for this one) that time
// spaces the requests out and the engines see less load than the study's cluster did, by an
// amount that depends on what else the machine runs (issue 22, "Host load").
//
// So the benchmark's clients say when they send a request and when they have its answer, and the
// engines say when a leg of it starts and ends (by the client's x-request-id, which the router
// passes on with a per-attempt suffix). While a request is sent and not answered and no engine has
// a leg of it, the router has it in hand, and the clock stands (SimClock.hold): the router takes
// no simulated time, as a real router's few milliseconds are next to a GPU's seconds.
//
// A request the router keeps on purpose (its edge admission queue, waiting for a decode node to
// free KV) must not stop the clock, or nothing would ever free: a hold ends after `capMs` real ms
// (counted in `capped`), and the time after that runs as before. A leg that starts resets it.

/** The router's per-attempt suffix on the client's x-request-id (src/routes: unique upstream ids). */
const ATTEMPT_SUFFIX = /-[0-9a-f]{8}[0-9a-z]{1,2}$/;

/** The client's x-request-id of an upstream id. @param {string} upstreamId */
export function clientRequestId(upstreamId) {
  return upstreamId.replace(ATTEMPT_SUFFIX, '');
}

/**
 * @typedef {{ legs: number, answered: boolean, capped: boolean, holding: boolean, since: number, heldMs: number, timer?: ReturnType<typeof setTimeout> }} Held
 */

export class RouterHolds {
  /**
   * @param {{ hold: () => void, release: () => void }} clock
   * @param {{ capMs?: number }} [options] capMs: the longest one request stops the clock, real ms
   */
  constructor(clock, { capMs = 1000 } = {}) {
    this.clock = clock;
    this.capMs = capMs;
    /** @type {Map<string, Held>} requests sent and not answered, by the client's x-request-id */
    this.requests = new Map();
    /** holds that reached capMs (a request the router kept: its edge queue, or a very slow router) */
    this.capped = 0;
    /** holds begun */
    this.holds = 0;
  }

  /** The client sent request `id` (its x-request-id): the router has it. @param {string} id */
  sent(id) {
    this.answered(id);
    const held = { legs: 0, answered: false, capped: false, holding: false, since: 0, heldMs: 0 };
    this.requests.set(id, held);
    this.#update(held);
  }

  /**
   * The client has the whole answer (or gave up): the real ms the router had it in hand (the
   * clock stood for them), undefined for a request not sent through sent().
   * @param {string} id @returns {number | undefined}
   */
  answered(id) {
    const held = this.requests.get(id);
    if (!held) return undefined;
    held.answered = true;
    this.#update(held);
    this.requests.delete(id);
    return held.heldMs;
  }

  /** An engine received a leg (its x-request-id as the router sent it). @param {string | undefined} upstreamId */
  legStarted(upstreamId) {
    const held = upstreamId === undefined ? undefined : this.requests.get(clientRequestId(upstreamId));
    if (!held) return;
    held.legs++;
    held.capped = false;
    this.#update(held);
  }

  /** An engine has answered a leg, or its connection closed. @param {string | undefined} upstreamId */
  legEnded(upstreamId) {
    const held = upstreamId === undefined ? undefined : this.requests.get(clientRequestId(upstreamId));
    if (!held) return;
    held.legs = Math.max(0, held.legs - 1);
    this.#update(held);
  }

  /** Release every hold (the run is over). */
  close() {
    for (const id of [...this.requests.keys()]) this.answered(id);
  }

  /** @param {Held} held */
  #update(held) {
    const hold = !held.answered && held.legs === 0 && !held.capped;
    if (hold && !held.holding) {
      held.holding = true;
      held.since = performance.now();
      this.holds++;
      this.clock.hold();
      held.timer = setTimeout(() => {
        held.capped = true;
        this.capped++;
        this.#update(held);
      }, this.capMs);
    } else if (!hold && held.holding) {
      held.holding = false;
      held.heldMs += performance.now() - held.since;
      clearTimeout(held.timer);
      this.clock.release();
    }
  }
}
