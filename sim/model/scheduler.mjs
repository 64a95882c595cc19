// One engine's continuous-batching step loop, as vLLM v1's scheduler runs it
// (vllm/v1/core/sched/scheduler.py): each step first gives every running request its next
// tokens (a decode token, or the next chunk of a prefill) within a token budget of
// `maxNumBatchedTokens`, then admits waiting requests first-come-first-served while their KV
// blocks fit and the budget and `maxNumSeqs` allow. A waiting request that does not fit stops
// admission (FCFS: nothing overtakes it). When a running request cannot grow by a block, the most
// recently admitted one is preempted (its blocks freed, recomputed later), as vLLM does.
//
// A P leg may also fetch the part of its prefix another engine holds instead of computing it
// (seed 000's content-addressed KV mesh: `fetchPrefix`): it takes its blocks, pulls the held
// units over the fabric, then prefills the rest.
//
// Three kinds of request:
// - `local`: prefilled here (chunked, sharing steps with the decodes), then decoded here
//   (colocated serving; a vLLM decode node given no kv_transfer_params).
// - `prefill`: prefilled here to produce one token (a P leg); with `hold`, its blocks stay held
//   after it finished, until a decode node reads them (vLLM's delay_free_blocks).
// - `remote`: its KV comes from another engine. It takes blocks for its whole prompt when
//   admitted (less what this engine already caches: the local prefix hit), pulls the rest, then
//   computes its last prompt token and decodes. Until the pull ends it counts as waiting, as
//   vLLM's WAITING_FOR_REMOTE_KVS requests do (the pull and the prefix fetch: kv-loading.mjs).
//
// Time is the cluster's simulated clock. A step's length comes from sim/model/step-time.mjs,
// plus the time the step loop stalls while KV moves in or out of this engine meanwhile
// (sim/model/fabric.mjs): bytes moved / `stallLoadBytesPerMs`, the effective load rate.
import { stepTime } from './step-time.mjs';
import { fetchPrefix, pullRemote } from './kv-loading.mjs';
import { Sequence } from './sequence.mjs';

export { Sequence };

/** @typedef {import('./sequence.mjs').PrefixFetch} PrefixFetch */

/**
 * @typedef {object} CoreOptions
 * @property {import('./clock.mjs').SimClock} clock
 * @property {import('./kv-memory.mjs').KvMemory} memory
 * @property {import('./step-time.mjs').StepCost} cost
 * @property {number} maxNumBatchedTokens token budget a step (vLLM max_num_batched_tokens)
 * @property {number} maxNumSeqs running requests at most (vLLM max_num_seqs)
 * @property {boolean} preemption preempt the newest request when a running one cannot grow
 * @property {number} stallLoadBytesPerMs effective load rate: KV moving in or out of this engine
 *   stalls its step 1 ms per this many bytes (Infinity: free)
 * @property {(at: number) => number} [moved] bytes landed on and read out of this engine up to simulated time `at` (the fabric's count)
 */

export class EngineCore {
  /** @param {CoreOptions} o */
  constructor(o) {
    this.o = o;
    /** @type {Sequence[]} */
    this.waiting = [];
    /** @type {Sequence[]} admission order */
    this.running = [];
    /** @type {Set<Sequence>} */
    this.loading = new Set();
    /** @type {Set<Sequence>} finished P legs whose blocks a decode node has not read yet */
    this.held = new Set();
    this.stepping = false;
    this.lastEnd = 0;
    this.movedMark = 0;
    this.closed = false;
    this.resetStats();
    o.memory.listeners.add(() => {
      this.#sampleUsage(this.o.clock.now());
      this.kick();
    });
  }

  resetStats() {
    this.stats = { steps: 0, preemptions: 0, busyMs: 0, stallMs: 0, prefillTokens: 0, decodeTokens: 0, usagePeak: 0 };
    this.usageIntegral = 0;
    this.usageSince = NaN;
    this.usageLastT = NaN;
    this.usageLast = 0;
  }

  /** @param {Partial<CoreOptions>} o */
  configure(o) {
    Object.assign(this.o, o);
  }

  /** Requests waiting (queued, or pulling their KV) and running, as the engine's metrics count them. */
  counts() {
    return { waiting: this.waiting.length + this.loading.size, running: this.running.length };
  }

  /** KV usage peak and time-weighted mean since the first request. @param {number} now */
  usageSummary(now) {
    this.#sampleUsage(now);
    const span = now - this.usageSince;
    return { peak: this.stats.usagePeak, mean: span > 0 ? this.usageIntegral / span : this.usageLast };
  }

  /** @param {Sequence} seq */
  submit(seq) {
    const now = this.o.clock.now();
    seq.arrival = now;
    if (Number.isNaN(this.usageSince)) this.usageSince = now;
    if (!this.o.memory.fitsAtAll(seq.promptTokens + 1)) {
      seq.error = 'too_long';
      seq.end('failed');
      return seq;
    }
    seq.state = 'waiting';
    seq.onAbort = () => this.#abort(seq);
    this.waiting.push(seq);
    this.kick();
    return seq;
  }

  /**
   * Start stepping if idle: at `at` (a simulated event's own time) or now. An event the event
   * loop ran late keeps its time, so a loaded machine's lag does not lengthen the request.
   * @param {number} [at]
   */
  kick(at) {
    if (this.stepping || this.closed) return;
    this.stepping = true;
    const t = Math.max(this.lastEnd, at !== undefined && Number.isFinite(at) ? Math.min(at, this.o.clock.now()) : this.o.clock.now());
    this.o.clock.at(t, (at) => this.#step(at));
  }

  /** Free the blocks a finished P leg held for its handle. @param {Sequence} seq */
  releaseHeld(seq) {
    if (!this.held.delete(seq)) return;
    if (seq.alloc) this.o.memory.release(seq.alloc);
  }

  close() {
    this.closed = true;
    for (const s of [...this.waiting, ...this.running, ...this.loading]) s.end('aborted');
    this.waiting = [];
    this.running = [];
    this.loading.clear();
  }

  /** Forget every request and figure (the engine's reset). */
  reset() {
    for (const s of [...this.waiting, ...this.running, ...this.loading]) s.end('aborted');
    this.waiting = [];
    this.running = [];
    this.loading.clear();
    this.held.clear();
    this.resetStats();
  }

  /** @param {Sequence} seq */
  #abort(seq) {
    const w = this.waiting.indexOf(seq);
    if (w >= 0) this.waiting.splice(w, 1);
    const r = this.running.indexOf(seq);
    if (r >= 0) this.running.splice(r, 1);
    this.loading.delete(seq);
    this.held.delete(seq);
    seq.end('aborted');
    if (seq.alloc) this.o.memory.release(seq.alloc);
  }

  /** @param {number} t */
  #sampleUsage(t) {
    if (Number.isNaN(this.usageSince)) return;
    if (!Number.isNaN(this.usageLastT) && t > this.usageLastT) this.usageIntegral += this.usageLast * (t - this.usageLastT);
    if (Number.isNaN(this.usageLastT) || t > this.usageLastT) this.usageLastT = t;
    this.usageLast = this.o.memory.usage();
    if (this.usageLast > this.stats.usagePeak) this.stats.usagePeak = this.usageLast;
  }

  /** One step at simulated time t: build the batch, run it, apply it. @param {number} t */
  #step(t) {
    if (this.closed) return;
    if (t > this.lastEnd + 1e-9) this.movedMark = this.o.moved?.(t) ?? 0; // idle meanwhile: what moved then cost nothing
    const { items, kvBlocked } = this.#schedule(t);
    for (const s of this.waiting) {
      if (kvBlocked) s.kvBlockedSince ??= Math.max(t, s.arrival);
      else if (s.kvBlockedSince !== undefined) {
        s.kvWaitMs += Math.max(0, t - s.kvBlockedSince);
        s.kvBlockedSince = undefined;
      }
    }
    this.#sampleUsage(t);
    if (items.length === 0) {
      this.lastEnd = t;
      const head = this.waiting[0];
      if (head && !kvBlocked && head.arrival > t) {
        // the step loop ran behind the clock (a late event loop): the next step is at its arrival
        this.o.clock.at(head.arrival, (at) => this.#step(at));
        return;
      }
      this.stepping = false;
      return;
    }
    const batch = { decodeContexts: /** @type {number[]} */ ([]), prefills: /** @type {{ tokens: number, context: number }[]} */ ([]) };
    for (const it of items) {
      if (it.decode) batch.decodeContexts.push(it.context);
      else batch.prefills.push({ tokens: it.tokens, context: it.context });
    }
    const { ms } = stepTime(this.o.cost, batch);
    this.o.clock.at(t + ms, (end) => {
      // KV that moved in or out during the step cost it time (each end's share of a transfer)
      const moved = this.o.moved?.(end) ?? 0;
      const rate = this.o.stallLoadBytesPerMs;
      const stall = Number.isFinite(rate) && rate > 0 ? (moved - this.movedMark) / rate : 0;
      this.movedMark = moved;
      if (stall > 1e-9) {
        this.stats.stallMs += stall;
        this.o.clock.at(end + stall, (end2) => this.#finishStep(t, end2, items));
      } else this.#finishStep(t, end, items);
    });
  }

  /**
   * @param {number} t
   * @returns {{ items: { seq: Sequence, decode: boolean, tokens: number, context: number }[], kvBlocked: boolean }}
   */
  #schedule(t) {
    const { memory, maxNumBatchedTokens, maxNumSeqs, preemption } = this.o;
    let budget = maxNumBatchedTokens;
    /** @type {{ seq: Sequence, decode: boolean, tokens: number, context: number }[]} */
    const items = [];
    let preempted = false;
    for (let i = 0; i < this.running.length && budget > 0; i++) {
      const seq = this.running[i];
      if (seq.pending > 0) {
        const n = Math.min(seq.pending, budget);
        items.push({ seq, decode: false, tokens: n, context: seq.computed });
        budget -= n;
        continue;
      }
      // a decode token: the sequence may need one more block
      let grown = memory.grow(/** @type {any} */ (seq.alloc), seq.computed + 1);
      while (!grown && preemption) {
        const victim = this.running[this.running.length - 1];
        this.#preempt(victim);
        preempted = true;
        if (victim === seq) break;
        grown = memory.grow(/** @type {any} */ (seq.alloc), seq.computed + 1);
      }
      if (!grown) {
        if (seq.state !== 'running') i--; // it was preempted itself: the list shifted
        continue;
      }
      items.push({ seq, decode: true, tokens: 1, context: seq.computed });
      budget -= 1;
    }
    let kvBlocked = false;
    while (!preempted && this.waiting.length > 0 && this.running.length + this.loading.size < maxNumSeqs) {
      const seq = this.waiting[0];
      // A step at t sees only the requests that had arrived by t. The step loop chains its steps
      // in simulated time, while a request's arrival is the clock's now(): when the event loop ran
      // late the loop is behind, and admitting a later arrival would serve it before it came.
      if (seq.arrival > t) break;
      const remote = seq.kind === 'remote';
      if (!remote && budget <= 0) break;
      const hit = memory.lookup(seq.hashes);
      // the prompt's tokens past its full units, and the first generated token
      const tail = seq.promptTokens + seq.generated - seq.hashes.length * memory.unitTokens + 1;
      const alloc = memory.allocate(seq.hashes, tail);
      if (!alloc) {
        kvBlocked = true;
        break;
      }
      this.waiting.shift();
      memory.touch(seq.hashes.slice(0, hit));
      seq.alloc = alloc;
      if (seq.kvBlockedSince !== undefined) {
        seq.kvWaitMs += Math.max(0, t - seq.kvBlockedSince);
        seq.kvBlockedSince = undefined;
      }
      const firstAdmission = Number.isNaN(seq.admittedAt);
      if (firstAdmission) {
        seq.admittedAt = t;
        seq.hitUnits = hit;
        seq.cachedTokens = Math.min(seq.promptTokens, hit * memory.unitTokens);
        seq.onAdmit?.(seq);
      }
      const cached = Math.min(seq.promptTokens + seq.generated, hit * memory.unitTokens);
      if (remote && firstAdmission && seq.load) {
        pullRemote(this, seq, alloc, t);
        continue;
      }
      // a P leg whose longer prefix another engine holds: fetch those units, then prefill the rest
      const fetch = firstAdmission && seq.fetchPrefix ? seq.fetchPrefix(hit, seq) : undefined;
      if (fetch && fetch.units > hit) {
        fetchPrefix(this, seq, fetch, hit, cached, t);
        continue;
      }
      // local, a P leg, or a preempted request recomputing: prefill what the cache lacks
      seq.kind = seq.kind === 'remote' ? 'local' : seq.kind;
      seq.computed = cached;
      seq.pending = Math.max(1, seq.promptTokens + seq.generated - cached);
      if (seq.pending === 1 && cached === seq.promptTokens + seq.generated) seq.computed -= 1;
      seq.state = 'running';
      this.running.push(seq);
      const n = Math.min(seq.pending, budget);
      if (n > 0) {
        items.push({ seq, decode: false, tokens: n, context: seq.computed });
        budget -= n;
      }
    }
    return { items, kvBlocked };
  }

  /** @param {Sequence} seq */
  #preempt(seq) {
    const i = this.running.indexOf(seq);
    if (i < 0) return;
    this.running.splice(i, 1);
    if (seq.alloc) this.o.memory.release(seq.alloc);
    seq.alloc = undefined;
    seq.state = 'waiting';
    seq.preemptions++;
    seq.pending = 0;
    seq.computed = 0;
    this.stats.preemptions++;
    this.waiting.unshift(seq);
  }

  /**
   * @param {number} start @param {number} end
   * @param {{ seq: Sequence, decode: boolean, tokens: number, context: number }[]} items
   */
  #finishStep(start, end, items) {
    if (this.closed) return;
    this.stats.steps++;
    this.stats.busyMs += end - start;
    for (const it of items) {
      const seq = it.seq;
      if (seq.state !== 'running') continue; // aborted or preempted meanwhile
      if (it.decode) {
        this.stats.decodeTokens++;
        seq.computed += 1;
      } else {
        this.stats.prefillTokens += it.tokens;
        seq.computed += it.tokens;
        seq.pending -= it.tokens;
        if (seq.pending > 0) continue;
        if (seq.alloc) this.o.memory.markReady(seq.alloc);
      }
      // this step produced the sequence's next token
      if (seq.generated === 0) seq.firstTokenAt = end;
      seq.emit({ index: seq.generated, at: end, stepMs: end - start });
      seq.generated++;
      if (seq.generated >= seq.maxTokens) this.#complete(seq, end);
    }
    this.lastEnd = end;
    this.#sampleUsage(end);
    this.stepping = false;
    if (this.waiting.length > 0 || this.running.length > 0) {
      this.stepping = true;
      this.#step(end);
    }
  }

  /** @param {Sequence} seq @param {number} end */
  #complete(seq, end) {
    const i = this.running.indexOf(seq);
    if (i >= 0) this.running.splice(i, 1);
    seq.finishedAt = end;
    if (seq.hold && seq.alloc) this.held.add(seq);
    else if (seq.alloc) this.o.memory.release(seq.alloc);
    seq.end('finished');
  }
}
