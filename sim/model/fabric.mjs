// KV transfers between the engines of a cluster over their network links.
//
// A transfer moves `bytes` (tokens x KV bytes a token of the model) from one engine to another.
// Each engine has a NIC of `linkBytesPerMs` in each direction (full duplex); the transfers going
// out of an engine share its outgoing rate equally, those coming in share its incoming rate, and a
// transfer runs at the smaller of its two shares. A transfer between engines of different groups
// (racks, seed 001's pdGroup) also crosses the spine: it gets `crossGroupShare` of that rate (the
// spine's oversubscription) and waits `crossGroupLatencyMs` more before its first byte. Rates are
// recomputed whenever a transfer starts or ends.
//
// Both ends pay for held KV that moves: the stalling bytes landed on an engine and read out of it
// during one of its steps lengthen that step by bytes / its effective load rate
// (sim/model/scheduler.mjs: the step loop stalls while KV moves through its HBM). A transfer says
// how many of its bytes stall (`stallBytes`, default all): a prefix fetched from the mesh and the
// cached context a decode node re-pulls from P stall; the KV a prefill has just computed for this
// request, streamed to D as its layers finish, does not (seed 000's own rows: P+D affinity's and
// the 1P+1D baseline's ITL p99 equal their TPOT p99 though every turn moves its new KV from P to
// D; the hook a connector streams it by: vLLM vllm/distributed/kv_transfer/kv_connector/v1/base.py
// `save_kv_layer`, "starts saving KV for layer i (maybe async)", called inside P's forward). That
// is seed 000's collision of KV transfers with decode steps, on the decode node pulling and on the
// node a prefix is fetched from; the rate is fitted (docs/simulator.md).
import { SimClock } from './clock.mjs';

/**
 * @typedef {object} LinkSpec
 * @property {number} linkBytesPerMs NIC bytes a simulated ms, each direction (Infinity: no limit)
 * @property {string} [group] rack / pdGroup; engines without one share the default group
 *
 * @typedef {object} FabricSettings
 * @property {number} setupMs fixed latency before a transfer's first byte (handshake, notification)
 * @property {number} crossGroupShare share (0..1] of the link rate a cross-group transfer gets
 * @property {number} crossGroupLatencyMs extra latency of a cross-group transfer
 *
 * @typedef {{ from: string, to: string, remaining: number, bytes: number, stallShare: number, rate: number, crossGroup: boolean, startedAt: number, doneAt?: number, done: (r: TransferResult) => void }} Transfer
 * @typedef {{ ms: number, bytes: number, crossGroup: boolean, at: number }} TransferResult
 *   at: the simulated time the last byte landed (the event's own time, however late it ran)
 */

export const DEFAULT_FABRIC = /** @type {FabricSettings} */ ({ setupMs: 0, crossGroupShare: 1, crossGroupLatencyMs: 0 });

export class Fabric {
  /** @param {SimClock} clock @param {Partial<FabricSettings>} [settings] */
  constructor(clock, settings = {}) {
    this.clock = clock;
    /** @type {FabricSettings} */
    this.settings = { ...DEFAULT_FABRIC, ...settings };
    /** @type {Map<string, LinkSpec & { landed: number, sent: number, stalling: number, in: number, out: number }>} */
    this.nodes = new Map();
    /** @type {Set<Transfer>} */
    this.active = new Set();
    this.lastAdvance = clock.now();
    /** @type {import('./clock.mjs').Scheduled | undefined} */
    this.next = undefined;
  }

  /** @param {string} id @param {LinkSpec} link */
  register(id, link) {
    const known = this.nodes.get(id);
    this.nodes.set(id, { landed: known?.landed ?? 0, sent: known?.sent ?? 0, stalling: known?.stalling ?? 0, in: known?.in ?? 0, out: known?.out ?? 0, ...link });
  }

  /** @param {Partial<FabricSettings>} settings */
  configure(settings) {
    Object.assign(this.settings, settings);
  }

  /** Whether a transfer between these engines crosses groups. @param {string} from @param {string} to */
  crossesGroups(from, to) {
    const a = this.nodes.get(from);
    const b = this.nodes.get(to);
    if (!a || !b) return false;
    return (a.group ?? '') !== (b.group ?? '');
  }

  /**
   * Move `bytes` from `from` to `to`; resolves when the last byte landed.
   * @param {string} from @param {string} to @param {number} bytes
   * @param {number} [at] the simulated time it starts (the caller's event time; default now): a
   *   caller whose event the event loop ran late must not start its transfer late
   * @param {number} [stallBytes] how many of the bytes stall both ends' step loops (default all;
   *   a prefill's fresh KV does not)
   * @returns {Promise<TransferResult>}
   */
  transfer(from, to, bytes, at, stallBytes = bytes) {
    const now = this.clock.now();
    const startedAt = at !== undefined && Number.isFinite(at) ? Math.min(at, now) : now;
    const crossGroup = this.crossesGroups(from, to);
    const latency = this.settings.setupMs + (crossGroup ? this.settings.crossGroupLatencyMs : 0);
    return new Promise((resolve) => {
      const begin = (/** @type {number} */ when) => {
        // the links have moved up to lastAdvance: a transfer whose caller ran behind starts there
        // (its time counts from where it could start, not from the caller's lag)
        const from0 = Math.max(startedAt, this.lastAdvance - latency);
        /** @type {Transfer} */
        const stallShare = bytes > 0 ? Math.min(1, Math.max(0, stallBytes / bytes)) : 0;
        const t = { from, to, bytes, stallShare, remaining: Math.max(0, bytes), rate: 0, crossGroup, startedAt: from0, done: resolve };
        this.#advance(when);
        this.active.add(t);
        this.#count(t, 1);
        this.#reschedule(when);
      };
      if (latency > 0) this.clock.at(startedAt + latency, begin);
      else begin(startedAt);
    });
  }

  /**
   * Bytes landed on an engine so far (every transfer into it, counted as they move).
   * @param {string} id @param {number} [at] up to this simulated time (the caller's event time; default now)
   */
  landed(id, at = this.clock.now()) {
    this.#advance(at);
    return this.nodes.get(id)?.landed ?? 0;
  }

  /**
   * Bytes read out of an engine so far (every transfer from it, counted as they move).
   * @param {string} id @param {number} [at] up to this simulated time (default now)
   */
  sent(id, at = this.clock.now()) {
    this.#advance(at);
    return this.nodes.get(id)?.sent ?? 0;
  }

  /**
   * Bytes landed on or read out of an engine so far that stall its step loop (each transfer's
   * stalling share of what moved).
   * @param {string} id @param {number} [at] up to this simulated time (default now)
   */
  stalling(id, at = this.clock.now()) {
    this.#advance(at);
    return this.nodes.get(id)?.stalling ?? 0;
  }

  /** Transfers running out of an engine now. @param {string} id */
  outgoing(id) {
    return this.nodes.get(id)?.out ?? 0;
  }

  /** Transfers running into an engine now. @param {string} id */
  incoming(id) {
    return this.nodes.get(id)?.in ?? 0;
  }

  clear() {
    this.next?.cancel();
    this.next = undefined;
    this.active.clear();
    for (const n of this.nodes.values()) Object.assign(n, { landed: 0, sent: 0, stalling: 0, in: 0, out: 0 });
  }

  /** @param {Transfer} t @param {number} d */
  #count(t, d) {
    const a = this.nodes.get(t.from);
    const b = this.nodes.get(t.to);
    if (a) a.out += d;
    if (b) b.in += d;
  }

  /** Move every active transfer forward to `now` at its current rate. @param {number} now */
  #advance(now) {
    const dt = now - this.lastAdvance;
    const since = this.lastAdvance;
    this.lastAdvance = Math.max(this.lastAdvance, now);
    if (!(dt > 0)) return;
    for (const t of this.active) {
      // a transfer that ends within this advance ends when its last byte lands, whoever advanced
      // the links past it (another engine's step may run ahead of this transfer's receiver)
      if (t.doneAt === undefined && t.rate > 0 && t.rate * dt >= t.remaining) t.doneAt = since + t.remaining / t.rate;
      const moved = Math.min(t.remaining, t.rate * dt);
      t.remaining -= moved;
      this.#moved(t, moved);
    }
  }

  #rates() {
    for (const t of this.active) {
      const a = this.nodes.get(t.from);
      const b = this.nodes.get(t.to);
      const out = a ? a.linkBytesPerMs / Math.max(1, a.out) : Infinity;
      const inn = b ? b.linkBytesPerMs / Math.max(1, b.in) : Infinity;
      t.rate = Math.min(out, inn) * (t.crossGroup ? this.settings.crossGroupShare : 1);
    }
  }

  /** @param {number} [at] */
  #reschedule(at = this.clock.now()) {
    // the transfers have moved up to lastAdvance: plan from there when an event ran behind it
    const now = Math.max(at, this.lastAdvance);
    this.next?.cancel();
    this.next = undefined;
    // finish what is done (or instantaneous), then plan the next completion
    for (const t of [...this.active]) {
      if (t.remaining <= 1e-6 || t.rate === Infinity) this.#finish(t, now);
    }
    this.#rates();
    for (const t of [...this.active]) {
      if (t.rate === Infinity || t.remaining <= 1e-6) this.#finish(t, now);
    }
    if (this.active.size > 0) this.#rates();
    let soonest = Infinity;
    for (const t of this.active) soonest = Math.min(soonest, t.remaining / t.rate);
    if (!Number.isFinite(soonest)) return;
    this.next = this.clock.at(now + soonest, (at) => {
      this.#advance(at);
      for (const t of [...this.active]) if (t.remaining <= t.bytes * 1e-9 + 1e-6) t.remaining = 0;
      this.#reschedule(at);
    });
  }

  /** Count bytes of a transfer as moved at both ends. @param {Transfer} t @param {number} bytes */
  #moved(t, bytes) {
    const to = this.nodes.get(t.to);
    const from = this.nodes.get(t.from);
    if (to) {
      to.landed += bytes;
      to.stalling += bytes * t.stallShare;
    }
    if (from) {
      from.sent += bytes;
      from.stalling += bytes * t.stallShare;
    }
  }

  /** @param {Transfer} t @param {number} now */
  #finish(t, now) {
    if (!this.active.delete(t)) return;
    if (t.remaining > 0) this.#moved(t, t.remaining);
    t.remaining = 0;
    this.#count(t, -1);
    const end = t.doneAt !== undefined ? Math.min(now, t.doneAt) : now;
    t.done({ ms: end - t.startedAt, bytes: t.bytes, crossGroup: t.crossGroup, at: end });
  }
}
