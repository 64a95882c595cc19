import { afterEach, describe, expect, it } from 'vitest';
import { setTimeout as sleep } from 'node:timers/promises';
import { SimClock } from '../../sim/model/clock.mjs';
import { RouterHolds, clientRequestId } from '../../sim/model/router-holds.mjs';

// The benchmark's engines run on a paced clock and the router in real time. On a busy machine the
// router's real time between a client and an engine grew to seconds of simulated time a request
// and thinned the closed loops the seeds' studies ran (issue 22, "Host load"). The clock now stands
// while the router has a request in hand. These tests hold the clock directly (SimClock) and through
// what the benchmark's clients and the engines report (RouterHolds).

/** @type {SimClock[]} */
const clocks = [];
afterEach(() => {
  for (const c of clocks.splice(0)) c.close();
});
/** @param {number} timeScale */
function clockOf(timeScale) {
  const c = new SimClock(timeScale);
  clocks.push(c);
  return c;
}

describe('SimClock hold', () => {
  it('stands while held: no simulated time passes and no event fires; on release it goes on from where it stood', async () => {
    const clock = clockOf(1); // 1 simulated ms = 1 real ms
    const start = clock.now();
    /** @type {number[]} */
    const fired = [];
    let releasedAt = 0;
    /** @type {number | undefined} */
    let firedRealAfterRelease;
    clock.at(start + 40, (t) => {
      fired.push(t);
      firedRealAfterRelease = performance.now() - releasedAt;
    });
    clock.hold();
    const heldAt = clock.now();
    // the event was 40 simulated ms ahead of the hold (less what passed before it)
    const ahead = start + 40 - heldAt;
    await sleep(120); // three times as long as the event was away
    expect(fired).toEqual([]);
    expect(clock.now()).toBe(heldAt);
    releasedAt = performance.now();
    clock.release();
    await sleep(ahead + 80);
    // fired once, at its own simulated time, no sooner after the release than it was ahead
    expect(fired).toEqual([start + 40]);
    expect(/** @type {number} */ (firedRealAfterRelease)).toBeGreaterThanOrEqual(ahead - 2);
    expect(clock.heldRealMs).toBeGreaterThanOrEqual(118);
    // time goes on from where it stood: the 120 real ms held are not simulated time
    expect(clock.now() - heldAt).toBeLessThan(performance.now() - releasedAt + 2);
  });

  it('counts holds: the clock runs again only when every hold is released', async () => {
    const clock = clockOf(1);
    clock.hold();
    clock.hold();
    const heldAt = clock.now();
    clock.release();
    await sleep(30);
    expect(clock.now()).toBe(heldAt);
    clock.release();
    await sleep(30);
    expect(clock.now()).toBeGreaterThan(heldAt);
  });

  it('an event scheduled while held fires after the release, and a cancelled one never', async () => {
    const clock = clockOf(1);
    clock.hold();
    /** @type {string[]} */
    const fired = [];
    clock.at(clock.now() + 5, () => fired.push('kept'));
    const dropped = clock.at(clock.now() + 5, () => fired.push('cancelled'));
    dropped.cancel();
    await sleep(30);
    expect(fired).toEqual([]);
    clock.release();
    await sleep(40);
    expect(fired).toEqual(['kept']);
  });

  it('does nothing in discrete-event mode (time scale 0), where the router takes no simulated time anyway', async () => {
    const clock = clockOf(0);
    clock.hold();
    await sleep(20);
    // held, an event still fires, and nothing is counted as time the clock stood
    const seen = await new Promise((resolve) => clock.at(10, resolve));
    expect(seen).toBe(10);
    expect(clock.holds).toBe(0);
    clock.release();
    expect(clock.heldRealMs).toBe(0);
  });
});

/** A clock that counts what RouterHolds asks of it. */
function countingClock() {
  return {
    held: 0,
    hold() {
      this.held++;
    },
    release() {
      this.held--;
    },
  };
}

describe('RouterHolds', () => {
  it('maps the router upstream id (the client x-request-id plus a per-attempt suffix) back to the client id', () => {
    // src/forward/lifecycle.ts upstreamId(): `${requestId}-${leaseId.slice(0, 8)}${(seq % 1296).toString(36)}`
    expect(clientRequestId('agentic-s12-t3-9f86d081a')).toBe('agentic-s12-t3');
    expect(clientRequestId('conv7-turn2-0123abcdzz')).toBe('conv7-turn2');
    expect(clientRequestId('conv7-turn2')).toBe('conv7-turn2');
  });

  it('holds the clock while a request is sent and no engine has a leg of it: the P -> D hand-off, the relay back', () => {
    const clock = countingClock();
    const holds = new RouterHolds(clock);
    holds.sent('conv1-turn1');
    expect(clock.held).toBe(1); // client -> router -> P
    holds.legStarted('conv1-turn1-aaaaaaaa1');
    expect(clock.held).toBe(0); // P has it
    holds.legEnded('conv1-turn1-aaaaaaaa1');
    expect(clock.held).toBe(1); // P answered, the router has not sent D its leg yet
    holds.legStarted('conv1-turn1-aaaaaaaa2');
    expect(clock.held).toBe(0);
    holds.legEnded('conv1-turn1-aaaaaaaa2');
    expect(clock.held).toBe(1); // D is done, the router relays the end to the client
    expect(holds.answered('conv1-turn1')).toBeGreaterThanOrEqual(0);
    expect(clock.held).toBe(0);
    expect(holds.holds).toBe(3);
  });

  it('fire-and-forget legs overlap: the clock runs while either is at an engine', () => {
    const clock = countingClock();
    const holds = new RouterHolds(clock);
    holds.sent('agentic-s1-t1');
    holds.legStarted('agentic-s1-t1-bbbbbbbb1'); // P
    holds.legStarted('agentic-s1-t1-bbbbbbbb2'); // D, at once
    holds.legEnded('agentic-s1-t1-bbbbbbbb1');
    expect(clock.held).toBe(0);
    holds.legEnded('agentic-s1-t1-bbbbbbbb2');
    expect(clock.held).toBe(1);
    holds.answered('agentic-s1-t1');
    expect(clock.held).toBe(0);
  });

  it("one request's hold does not end another's, and legs of requests no client announced change nothing", () => {
    const clock = countingClock();
    const holds = new RouterHolds(clock);
    holds.sent('a');
    holds.sent('b');
    expect(clock.held).toBe(2);
    holds.legStarted('a-cccccccc1');
    expect(clock.held).toBe(1);
    holds.legStarted('someone-else-cccccccc1');
    holds.legEnded(undefined);
    expect(clock.held).toBe(1);
    expect(holds.answered('unknown')).toBeUndefined();
    holds.close();
    expect(clock.held).toBe(0);
  });

  it('a request the router keeps (its edge queue) stops the clock for at most capMs; a leg that starts resets the cap', async () => {
    const clock = countingClock();
    const holds = new RouterHolds(clock, { capMs: 20 });
    holds.sent('queued');
    expect(clock.held).toBe(1);
    await sleep(60);
    // waiting for KV that only a running clock frees: the clock runs again
    expect(clock.held).toBe(0);
    expect(holds.capped).toBe(1);
    holds.legStarted('queued-dddddddd1');
    holds.legEnded('queued-dddddddd1');
    expect(clock.held).toBe(1); // the hand-off after it holds again
    holds.answered('queued');
    expect(clock.held).toBe(0);
  });
});

describe('engines report the legs they serve', () => {
  it('a leg at an engine runs the clock a client hold stopped, and its end stops it again until the client has the answer', async () => {
    const { startSimCluster } = await import('../../sim/cluster.mjs');
    const cluster = await startSimCluster({ engines: [{ id: 'n0', role: 'both' }], defaults: { timeScale: 1, models: ['m1'] } });
    try {
      const { clock, holds } = /** @type {any} */ ([...cluster.registry.clocks.values()][0]);
      holds.capMs = 60_000; // only a leg may end this hold
      holds.sent('turn-1');
      expect(clock.holds).toBe(1);
      const standing = clock.now();
      await sleep(50);
      expect(clock.now()).toBe(standing);
      // the engine's steps run on the held clock: this answer exists only if the leg started it
      const res = await fetch(`${cluster.engines.get('n0').url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-request-id': 'turn-1-0a1b2c3d4' },
        body: JSON.stringify({ model: 'm1', prompt: 'hello there', max_tokens: 8 }),
        signal: AbortSignal.timeout(10_000),
      });
      expect(res.status).toBe(200);
      await res.json();
      expect(clock.now()).toBeGreaterThan(standing);
      // the engine's connection closes after its answer: the router has the request again
      await expect.poll(() => clock.holds, { timeout: 2000 }).toBe(1);
      // held at least through the 50 ms sleep (a little less as performance.now() rounds timers)
      expect(holds.answered('turn-1')).toBeGreaterThanOrEqual(45);
      expect(clock.holds).toBe(0);
      expect(holds.capped).toBe(0);
    } finally {
      await cluster.close();
    }
  });
});
