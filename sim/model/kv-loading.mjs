// A sequence whose KV, or part of it, comes from another engine: admitted with its blocks taken, it
// waits in `loading` (counted as waiting, as vLLM's WAITING_FOR_REMOTE_KVS requests are) until
// the bytes landed over the fabric (sim/model/fabric.mjs), then joins the running batch of its
// step loop (sim/model/scheduler.mjs).
// - pullRemote: a `remote` request (a decode leg) pulls the prompt's KV this engine lacks; vLLM
//   recomputes the prompt's last token on the decode node, its first output token.
// - fetchPrefix: a P leg fetches the prefix units another engine holds (seed 000's KV mesh), then
//   prefills the rest; when the holder went away it computes it all.

/**
 * The step loop, as these need it (sim/model/scheduler.mjs EngineCore).
 * @typedef {{ o: { memory: import('./kv-memory.mjs').KvMemory, clock: import('./clock.mjs').SimClock }, loading: Set<Sequence>, running: Sequence[], kick: (at?: number) => void }} LoadingCore
 * @typedef {import('./sequence.mjs').Sequence} Sequence
 * @typedef {import('./sequence.mjs').PrefixFetch} PrefixFetch
 */

/**
 * Pull the KV a remote request lacks, from the admitting step's time `t`.
 * @param {LoadingCore} core @param {Sequence} seq @param {import('./kv-memory.mjs').Allocation} alloc @param {number} t
 */
export function pullRemote(core, seq, alloc, t) {
  const { memory } = core.o;
  seq.state = 'loading';
  core.loading.add(seq);
  const missing = seq.promptTokens - seq.cachedTokens;
  seq.load(missing, seq, t).then(
    (r) => {
      if (seq.state !== 'loading') return;
      core.loading.delete(seq);
      seq.loadMs = r.ms;
      seq.loadedAt = Number.isFinite(r.at) ? /** @type {number} */ (r.at) : core.o.clock.now();
      memory.markReady(alloc);
      // vLLM recomputes the prompt's last token on the decode node (the first output token)
      seq.computed = seq.promptTokens - 1;
      seq.pending = 1;
      seq.state = 'running';
      core.running.push(seq);
      core.kick(seq.loadedAt);
    },
    (/** @type {any} */ e) => {
      if (seq.state !== 'loading') return;
      core.loading.delete(seq);
      seq.error = e instanceof Error ? e.message : 'kv_transfer_failed';
      seq.errorStatus = typeof e?.status === 'number' ? e.status : undefined;
      memory.release(alloc);
      seq.end('failed');
    },
  );
}

/**
 * Fetch the `fetch.units` prefix units another engine holds (this engine held `hit` of them), then
 * prefill the rest; `cached` tokens are what a prefill here would start from.
 * @param {LoadingCore} core @param {Sequence} seq @param {PrefixFetch} fetch @param {number} hit @param {number} cached @param {number} t
 */
export function fetchPrefix(core, seq, fetch, hit, cached, t) {
  const { memory } = core.o;
  seq.state = 'loading';
  seq.fetchedUnits = fetch.units - hit;
  core.loading.add(seq);
  fetch.run(t).then(
    (r) => {
      if (seq.state !== 'loading') return;
      core.loading.delete(seq);
      seq.loadMs = r.ms;
      const have = Math.min(seq.promptTokens - 1, fetch.units * memory.unitTokens);
      // the answer's cached tokens count what was fetched, as vLLM's do what its KV connector
      // loaded (vllm/v1/core/sched/scheduler.py: num_computed_tokens = local + external, and
      // num_cached_tokens is set from it); the engine's prefix-cache hits stay the local ones
      seq.cachedTokens = Math.max(seq.cachedTokens, have);
      seq.computed = have;
      seq.pending = Math.max(1, seq.promptTokens - have);
      seq.state = 'running';
      core.running.push(seq);
      core.kick(r.at);
    },
    () => {
      // the holder went away: compute it all here
      if (seq.state !== 'loading') return;
      core.loading.delete(seq);
      seq.fetchedUnits = 0;
      seq.computed = cached;
      seq.pending = Math.max(1, seq.promptTokens - cached);
      seq.state = 'running';
      core.running.push(seq);
      core.kick();
    },
  );
}
