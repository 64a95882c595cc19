// `tiers`: service tiers and fair share at the edge under overload (issue 23, Proof: "at twice
// the sustainable load with 20% of requests `priority` and four API keys of unequal demand:
// priority TTFT p90 within 1.5x of its unloaded value, `flex` shed first, each key's admitted
// share within 10% of fair, 0 lost, nothing held upstream by a queued request").
//
// The router in workerd over real TCP in front of 2 P + 2 D simulated engines (default preset,
// time scale 1: simulated ms are real ms, so the edge queue's real wait and the engines' time add
// up in the TTFT the client measures). The decode nodes' KV memory is small (`--decode-blocks`
// 512-token units), so their KV is the binding limit: the router polls the engines' /metrics
// (`signals`), its KV guard finds both D busy and requests wait in the pool's edge queue
// (`admission`, docs/admission.md). P prefills faster than the preset (`--prefill-ms-per-token`)
// so that P is not the limit. Every request is a stream with a prompt of its own (no prefix hits).
// Four API keys (`API_KEYS`, no tier of their own); `service_tier` in the body sets the tier.
//
// Three phases on one stack, all measured in this run:
//   1. capacity: a closed loop of `--probe-concurrency` clients (all `default`), past what the
//      decode nodes hold, for `--probe-seconds`; the sustainable rate C is the completions a
//      second after the first fifth of the phase (the cluster at its KV limit, the queue full).
//   2. unloaded: Poisson arrivals (seeded) at `--unloaded-load` x C for `--unloaded-seconds`, the
//      tier and key mix of phase 3: each tier's TTFT p90 is the reference.
//   3. overload: Poisson arrivals at `--load` x C for `--seconds`: 20% `priority`, 30% `flex`,
//      the rest `default`; keys k1..k4 send 50 / 25 / 15 / 10% of them.
// Recorded per request (one JSON line each in bench/out/<json name>-requests.jsonl): key, tier,
// status and error code, TTFT (first body byte of the stream), the wait at the edge (server-timing
// `queue`), whether the whole answer came (every token and the usage chunk). Upstream: every
// leg each engine received (its x-request-id begins with the client's), against the requests
// that were admitted.
//
// Fair share: admission is by tier first, then turns across keys within a tier (docs/admission.md),
// so a key's fair count is, tier by tier, the max-min fair split of what that tier was admitted
// over the keys' arrivals in it (`fairCounts`), summed over the tiers.
//
// `npm run bench -- tiers [--seconds 90] [--load 2] [--probe-seconds 30] [--probe-concurrency 48]
//   [--unloaded-seconds 45] [--unloaded-load 0.25] [--seed 23] [--prompt-tokens 2048]
//   [--output-tokens 32] [--decode-blocks 40] [--prefill-ms-per-token 0.02] [--kv-busy 0.9] [--stale-ms 5000] [--queue-ms 5000]
//   [--max-queued 64] [--priority-reserve 0] [--quick] [--json bench/results/tiers.json]`
import { mkdirSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { numberOption, stringOption } from '../lib/args.mjs';
import { startStack } from '../lib/harness.mjs';
import { postJson } from '../lib/http-client.mjs';
import { routerMetrics, sumBy, total } from '../lib/prometheus.mjs';
import { markdownTable } from '../lib/report.mjs';
import { percentile, ratio, round } from '../lib/stats.mjs';
import { mulberry32, seededText } from '../lib/text.mjs';
import { edgeQueueMs } from './agentic.mjs';

export const TIERS = /** @type {const} */ (['priority', 'default', 'flex']);
export const TIER_MIX = { priority: 0.2, default: 0.5, flex: 0.3 };
export const KEYS = ['k1', 'k2', 'k3', 'k4'];
export const KEY_MIX = [0.5, 0.25, 0.15, 0.1];
const API_KEY = (/** @type {string} */ k) => `tiers-bench-${k}`;
const ADMIN_TOKEN = 'tiers-admin-token';
/** the goals of issue 23's proof */
export const GOALS = { priorityTtftP90Ratio: 1.5, fairShareDeviation: 0.1 };

/**
 * @typedef {{ phase: string, id: string, key: string, tier: typeof TIERS[number], sentAtMs: number, sentEpochMs: number, status: number, code?: string,
 *   ttftMs: number, totalMs: number, edgeMs: number, complete: boolean, error?: string }} Outcome
 */

/**
 * Max-min fair split of `capacity` turns over demands: each key gets at most its demand, and what
 * a key does not use is shared evenly by the others (progressive filling).
 * @param {number} capacity @param {Record<string, number>} demands
 * @returns {Record<string, number>}
 */
export function maxMinFair(capacity, demands) {
  /** @type {Record<string, number>} */
  const out = Object.fromEntries(Object.keys(demands).map((k) => [k, 0]));
  let left = Math.max(0, capacity);
  const open = Object.keys(demands)
    .filter((k) => demands[k] > 0)
    .sort((a, b) => demands[a] - demands[b]);
  while (open.length > 0) {
    const even = left / open.length;
    const k = /** @type {string} */ (open[0]);
    if (demands[k] > even) {
      for (const rest of open) out[rest] = even;
      break;
    }
    out[k] = demands[k];
    left -= demands[k];
    open.shift();
  }
  return out;
}

/**
 * Each key's admitted requests against its fair count: per tier, the max-min split of that
 * tier's admissions over the keys' arrivals in it, summed over the tiers; `deviation` is
 * admitted / fair - 1.
 * @param {Pick<Outcome, 'key' | 'tier' | 'status'>[]} outcomes
 * @param {string[]} [keys]
 */
export function fairCounts(outcomes, keys = KEYS) {
  const zero = () => Object.fromEntries(keys.map((k) => [k, 0]));
  /** @type {Record<string, number>} */
  const admitted = zero();
  /** @type {Record<string, number>} */
  const fair = zero();
  for (const tier of TIERS) {
    const mine = outcomes.filter((o) => o.tier === tier);
    /** @type {Record<string, number>} */
    const demand = zero();
    for (const o of mine) demand[o.key] += 1;
    const served = mine.filter((o) => o.status === 200);
    for (const o of served) admitted[o.key] += 1;
    const split = maxMinFair(served.length, demand);
    for (const k of keys) fair[k] += split[k];
  }
  const total = Object.values(admitted).reduce((a, b) => a + b, 0);
  return keys.map((key) => ({
    key,
    arrived: outcomes.filter((o) => o.key === key).length,
    admitted: admitted[key],
    fair: round(fair[key], 1),
    admittedShare: total ? round(admitted[key] / total, 3) : NaN,
    fairShare: total ? round(fair[key] / total, 3) : NaN,
    deviation: fair[key] > 0 ? round(admitted[key] / fair[key] - 1, 3) : NaN,
  }));
}

/** A refusal that says what happened: 503 cluster_busy / slo_unmeetable or 429 fair_share_exceeded, with its code. @param {Outcome} o */
export const clearRefusal = (o) => (o.status === 503 || o.status === 429) && typeof o.code === 'string' && o.code.length > 0;

/** A percentile of one figure of the outcomes, in ms to 0.1. @param {Outcome[]} xs @param {'ttftMs' | 'edgeMs'} field @param {number} p */
const pct = (xs, field, p) =>
  round(
    percentile(
      xs.map((o) => o[field]),
      p,
    ),
    1,
  );

/** Per tier: arrivals, admitted (200 with the whole answer), refused by code, lost, TTFT and edge wait of the admitted. @param {Outcome[]} outcomes */
export function byTier(outcomes) {
  return Object.fromEntries(
    TIERS.map((tier) => {
      const mine = outcomes.filter((o) => o.tier === tier);
      const ok = mine.filter((o) => o.complete);
      /** @type {Record<string, number>} */
      const refused = {};
      for (const o of mine.filter(clearRefusal)) refused[`${o.status} ${o.code}`] = (refused[`${o.status} ${o.code}`] ?? 0) + 1;
      const refusedCount = Object.values(refused).reduce((a, b) => a + b, 0);
      const waited = ok.filter((o) => o.edgeMs > 0);
      return [
        tier,
        {
          arrived: mine.length,
          admitted: ok.length,
          refused,
          refusedShare: mine.length ? round(refusedCount / mine.length, 3) : NaN,
          lost: mine.length - ok.length - refusedCount,
          ttftP50Ms: pct(ok, 'ttftMs', 50),
          ttftP90Ms: pct(ok, 'ttftMs', 90),
          // what the request spent past the edge: its TTFT less its wait there
          pastEdgeP90Ms: round(
            percentile(
              ok.map((o) => o.ttftMs - o.edgeMs),
              90,
            ),
            1,
          ),
          waitedAtEdge: waited.length,
          edgeP50Ms: pct(ok, 'edgeMs', 50),
          edgeP90Ms: pct(ok, 'edgeMs', 90),
        },
      ];
    }),
  );
}

/** Pick an index by weights. @param {() => number} rand @param {number[]} weights */
function pick(rand, weights) {
  let x = rand() * weights.reduce((a, b) => a + b, 0);
  for (let i = 0; i < weights.length; i++) {
    x -= weights[i];
    if (x < 0) return i;
  }
  return weights.length - 1;
}

/** @param {Record<string, string | true>} options */
function settingsOf(options) {
  const quick = options.quick === true;
  return {
    quick,
    seconds: numberOption(options, 'seconds', quick ? 20 : 90),
    load: numberOption(options, 'load', 2),
    probeSeconds: numberOption(options, 'probe-seconds', quick ? 12 : 30),
    probeConcurrency: numberOption(options, 'probe-concurrency', 48),
    unloadedSeconds: numberOption(options, 'unloaded-seconds', quick ? 12 : 45),
    unloadedLoad: numberOption(options, 'unloaded-load', 0.25),
    seed: numberOption(options, 'seed', 23),
    promptTokens: numberOption(options, 'prompt-tokens', 2048),
    outputTokens: numberOption(options, 'output-tokens', 32),
    decodeBlocks: numberOption(options, 'decode-blocks', 40),
    prefillMsPerToken: numberOption(options, 'prefill-ms-per-token', 0.02),
    kvBusy: numberOption(options, 'kv-busy', 0.9),
    staleMs: numberOption(options, 'stale-ms', 5000),
    queueMs: numberOption(options, 'queue-ms', 5000),
    maxQueued: numberOption(options, 'max-queued', 64),
    // admission.priorityReserve: the share of each D's KV the guard keeps for priority requests
    priorityReserve: numberOption(options, 'priority-reserve', 0),
  };
}

/** @param {Record<string, string | true>} options */
export async function runTiers(options) {
  const s = settingsOf(options);
  const stack = await startStack({
    engines: [
      { id: 'p0', role: 'prefill', prefillMsPerToken: s.prefillMsPerToken },
      { id: 'p1', role: 'prefill', prefillMsPerToken: s.prefillMsPerToken },
      { id: 'd0', role: 'decode', cacheBlocks: s.decodeBlocks },
      { id: 'd1', role: 'decode', cacheBlocks: s.decodeBlocks },
    ],
    defaults: { timeScale: 1 },
    clusterDocument: (engines) => ({
      protocol: 'vllm',
      policy: { prefill: 'least_load', decode: 'least_load' },
      // KV is the limit: a poll a second, the engine queue's threshold out of the way
      signals: { intervalMs: 1000, staleMs: s.staleMs, kvBusy: s.kvBusy, queueBusy: 64 },
      admission: { queueMs: s.queueMs, maxQueued: s.maxQueued, fairShare: 'apiKey', priorityReserve: s.priorityReserve },
      nodes: [...engines.values()].map((e) => ({ id: e.id, url: e.url, role: e.role })),
    }),
    vars: { API_KEYS: KEYS.map(API_KEY).join(','), ADMIN_TOKEN },
  });
  const url = `${stack.router.url}/v1/chat/completions`;
  // a connection a request: a kept-alive socket the server closed as the client reused it ends in
  // "socket hang up" with no answer (one in 2,907 in a run), which would count as lost
  const agent = new http.Agent({ keepAlive: false, maxSockets: Infinity });
  const promptChars = s.promptTokens * 4;
  let n = 0;
  /** @param {string} phase @param {string} key @param {typeof TIERS[number]} tier @param {number} phaseStart @returns {Promise<Outcome>} */
  const send = async (phase, key, tier, phaseStart) => {
    const id = `tiers${phase}${n++}`;
    const sentAtMs = performance.now() - phaseStart;
    const sentEpochMs = Date.now();
    const body = {
      model: 'sim-model',
      stream: true,
      stream_options: { include_usage: true },
      max_tokens: s.outputTokens,
      ...(tier === 'default' ? {} : { service_tier: tier }),
      messages: [{ role: 'user', content: seededText(s.seed * 100_003 + n, promptChars, `${id}:`) }],
    };
    const r = await postJson(url, body, { agent, headers: { authorization: `Bearer ${API_KEY(key)}`, 'x-request-id': id }, timeoutMs: 120_000 });
    const complete = r.status === 200 && !r.error && r.usage?.completion_tokens === s.outputTokens;
    return {
      phase,
      id,
      key,
      tier,
      sentAtMs: round(sentAtMs, 1),
      sentEpochMs,
      status: r.status,
      ...(r.json?.error?.code ? { code: String(r.json.error.code) } : {}),
      ttftMs: round(r.ttfbMs, 1),
      totalMs: round(r.totalMs, 1),
      edgeMs: edgeQueueMs(r.headers['server-timing']),
      complete,
      ...(r.error && !complete ? { error: r.error } : {}),
    };
  };
  /** Poisson arrivals at `rate` a second for `seconds`, tiers and keys mixed (seeded). */
  const openLoop = async (/** @type {string} */ phase, /** @type {number} */ rate, /** @type {number} */ seconds, /** @type {number} */ seed) => {
    const gaps = mulberry32(seed);
    const mix = mulberry32(seed + 1);
    const start = performance.now();
    /** @type {Promise<Outcome>[]} */
    const pending = [];
    let at = 0;
    for (;;) {
      at += (-Math.log(1 - gaps()) / rate) * 1000;
      if (at >= seconds * 1000) break;
      const key = KEYS[pick(mix, KEY_MIX)];
      const tier =
        TIERS[
          pick(
            mix,
            TIERS.map((t) => TIER_MIX[t]),
          )
        ];
      const wait = start + at - performance.now();
      if (wait > 0) await sleep(wait);
      pending.push(send(phase, key, tier, start));
    }
    return Promise.all(pending);
  };
  const rejectedNow = async () => sumBy(await routerMetrics(stack.router.url), 'pd_router_admission_rejected_total', ['reason', 'tier']);
  try {
    // the guard fails open without a poll: a few requests, then two polls, before the closed loop
    for (const key of KEYS) await send('w', key, 'default', performance.now());
    await sleep(2_500);
    // 1. capacity: a closed loop past the decode nodes' KV
    const probeSignals = signalAges(stack);
    const probeStart = performance.now();
    const probeEnd = probeStart + s.probeSeconds * 1000;
    /** @type {Outcome[]} */
    const probe = [];
    await Promise.all(
      Array.from({ length: s.probeConcurrency }, async (_, i) => {
        while (performance.now() < probeEnd) probe.push(await send('c', KEYS[i % KEYS.length], 'default', probeStart));
      }),
    );
    const warmMs = (s.probeSeconds * 1000) / 5;
    const counted = probe.filter((o) => o.complete && o.sentAtMs + o.totalMs >= warmMs && o.sentAtMs + o.totalMs <= s.probeSeconds * 1000);
    const sustainable = counted.length / (s.probeSeconds - warmMs / 1000);
    const capacitySignals = await probeSignals.stop();
    await idle(stack);
    // 2. unloaded
    const unloaded = await openLoop('u', s.unloadedLoad * sustainable, s.unloadedSeconds, s.seed * 7 + 1);
    await idle(stack);
    // 3. overload
    const rejectedBefore = await rejectedNow();
    const arrivals = legArrivals(stack, 'tierso');
    const overloadSignals = signalAges(stack);
    const overload = await openLoop('o', s.load * sustainable, s.seconds, s.seed * 7 + 3);
    const signals = { capacity: capacitySignals, overload: await overloadSignals.stop() };
    const drained = await idle(stack);
    const rejectedAfter = await rejectedNow();
    const perLeg = await stack.requestStats();
    const upstream = upstreamCheck(perLeg, arrivals.stop(), overload);
    const engines = engineFigures(perLeg, [...probe, ...unloaded, ...overload]);
    writeOutcomes(stringOption(options, 'json'), [...probe, ...unloaded, ...overload]);
    const result = tiersFigures({ s, probe, sustainable, unloaded, overload, upstream, drained, rejectedBefore, rejectedAfter, engines, signals });
    return { report: result, table: tiersTable(result), chart: tiersChart(result) };
  } finally {
    agent.destroy();
    await stack.close();
  }
}

/**
 * Every request's outcome, one JSON line each, in bench/out/ (`<json's name>-requests.jsonl`, not
 * committed): too many for the JSON, which keeps the figures.
 * @param {string | undefined} jsonPath @param {Outcome[]} outcomes
 */
function writeOutcomes(jsonPath, outcomes) {
  const file = path.join('bench', 'out', `${path.basename(jsonPath ?? 'tiers.json').replace(/\.json$/i, '')}-requests.jsonl`);
  mkdirSync(path.dirname(path.resolve(file)), { recursive: true });
  writeFileSync(file, outcomes.map((o) => JSON.stringify(o)).join('\n') + '\n');
}

/** Waits until no lease is held, nothing waits at the edge and no engine has a request in flight; ms it took, NaN when not within 30 s. @param {import('../lib/harness.mjs').Stack} stack */
async function idle(stack) {
  const started = performance.now();
  while (performance.now() - started < 30_000) {
    const status = /** @type {any} */ (await (await fetch(`${stack.router.url}/admin/status`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } })).json());
    const engines = /** @type {Record<string, { inflight: number }>} */ (await stack.stats());
    const queued = total(await routerMetrics(stack.router.url), 'pd_router_admission_queued');
    if (status.leases === 0 && queued === 0 && Object.values(engines).every((e) => e.inflight === 0)) return Math.round(performance.now() - started);
    await sleep(200);
  }
  return Number.NaN;
}

/**
 * How old the decode nodes' engine signals were, read from /admin/status every second until
 * `stop()`: without a reading younger than `signals.staleMs` the KV guard fails open (never busy),
 * and the router sends whatever comes, the overload included, on to the engines.
 * @param {import('../lib/harness.mjs').Stack} stack
 */
function signalAges(stack) {
  let running = true;
  const ages = /** @type {number[]} */ ([]);
  let stale = 0;
  const loop = (async () => {
    while (running) {
      const status = /** @type {any} */ (await (await fetch(`${stack.router.url}/admin/status`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } })).json());
      for (const n of status.nodes.filter((/** @type {any} */ x) => x.roles.includes('decode'))) {
        ages.push(n.signals?.ageMs ?? Number.POSITIVE_INFINITY);
        if (!n.signals?.projected) stale++;
      }
      await sleep(1000);
    }
  })();
  return {
    async stop() {
      running = false;
      await loop;
      return { samples: ages.length, stale, ageP50Ms: round(percentile(ages, 50), 0), maxAgeMs: round(Math.max(0, ...ages), 0) };
    },
  };
}

/**
 * When each leg whose x-request-id begins with `prefix` reached its engine: the engines keep
 * their last 500 requests, so they are read every second until `stop()`.
 * @param {import('../lib/harness.mjs').Stack} stack @param {string} prefix
 */
function legArrivals(stack, prefix) {
  /** @type {Map<string, number>} engine/leg x-request-id -> when the engine received it (epoch ms) */
  const seen = new Map();
  const collect = () => {
    for (const e of stack.cluster.engines.values()) {
      for (const entry of e.requests()) {
        const id = String(entry.headers['x-request-id'] ?? '');
        if (id.startsWith(prefix) && !seen.has(`${e.id}/${id}`)) seen.set(`${e.id}/${id}`, entry.receivedAt);
      }
    }
  };
  const timer = setInterval(collect, 1000);
  return {
    stop() {
      clearInterval(timer);
      collect();
      return seen;
    },
  };
}

/**
 * What reached the engines during the overload, against each request's outcome: every leg an
 * engine counted (its x-request-id begins with the client's id), and when it arrived. A request
 * refused at the edge must have sent nothing; one that waited, nothing before its wait ended.
 * @param {Record<string, Record<string, unknown>>} perLeg leg x-request-id -> engine -> its figures
 * @param {Map<string, number>} arrivals engine/leg x-request-id -> when the engine received it
 * @param {Outcome[]} outcomes
 */
function upstreamCheck(perLeg, arrivals, outcomes) {
  const byId = new Map(outcomes.map((o) => [o.id, o]));
  const phase = outcomes[0]?.id.replace(/\d+$/, '') ?? '';
  let legs = 0;
  let legsOfRefused = 0;
  let legsBeforeWaitEnded = 0;
  /** @type {Set<string>} */
  const reached = new Set();
  for (const [legId, byEngine] of Object.entries(perLeg)) {
    const o = byId.get(legId.split('-')[0]);
    if (!o) continue;
    reached.add(o.id);
    for (const engine of Object.keys(byEngine)) {
      legs++;
      if (o.status !== 200) legsOfRefused++;
      const at = arrivals.get(`${engine}/${legId}`);
      // the wait is the Durable Object's (workerd's clock, coarse): 50 ms of slack
      if (at !== undefined && o.edgeMs > 0 && at < o.sentEpochMs + o.edgeMs - 50) legsBeforeWaitEnded++;
    }
  }
  const admitted = outcomes.filter((o) => o.status === 200).length;
  const timed = [...arrivals.keys()].filter((id) => id.split('/')[1]?.startsWith(phase)).length;
  return { legs, legsTimed: timed, requestsReached: reached.size, admitted, legsOfRefused, legsBeforeWaitEnded };
}

/**
 * Where the admitted requests' time went inside the engines, per phase and tier (simulated ms =
 * real ms here): P's queue, D's queue (KV memory included), D's first token after its KV was
 * there, and D's time per output token. Means.
 * @param {Record<string, Record<string, any>>} perLeg x-request-id of a leg -> engine -> its figures
 * @param {Outcome[]} outcomes
 */
function engineFigures(perLeg, outcomes) {
  /** @type {Map<string, any[]>} */
  const legs = new Map();
  for (const [legId, byEngine] of Object.entries(perLeg)) {
    const id = legId.split('-')[0];
    legs.set(id, [...(legs.get(id) ?? []), ...Object.values(byEngine)]);
  }
  const mean = (/** @type {number[]} */ xs) => (xs.length ? round(xs.reduce((a, b) => a + b, 0) / xs.length, 1) : NaN);
  /** @type {Record<string, any>} */
  const out = {};
  const names = { c: 'capacity', u: 'unloaded', o: 'overload' };
  for (const [phase, name] of Object.entries(names)) {
    for (const tier of TIERS) {
      const recs = outcomes.filter((o) => o.phase === phase && o.tier === tier && o.complete).flatMap((o) => legs.get(o.id) ?? []);
      if (recs.length === 0) continue;
      const p = recs.filter((r) => r.leg === 'vllmPrefill');
      const d = recs.filter((r) => r.leg === 'vllmDecode');
      out[`${name}/${tier}`] = {
        prefillQueueMs: mean(p.map((r) => r.queueMs)),
        decodeQueueMs: mean(d.map((r) => r.queueMs)),
        decodeKvWaitMs: mean(d.map((r) => r.kvWaitMs ?? 0)),
        decodeKvWaitedShare: d.length ? round(d.filter((r) => (r.kvWaitMs ?? 0) > 0).length / d.length, 3) : NaN,
        decodeFirstTokenMs: mean(d.map((r) => r.decodeFirstTokenMs)),
        tpotMs: mean(d.map((r) => r.tpotMs)),
      };
    }
  }
  return out;
}

/** The report from the phases' outcomes. @param {any} r */
export function tiersFigures({ s, probe, sustainable, unloaded, overload, upstream, drained, rejectedBefore, rejectedAfter, engines = {}, signals = null }) {
  const unloadedTiers = byTier(unloaded);
  const overloadTiers = byTier(overload);
  const shares = fairCounts(overload);
  /** @type {Record<string, number>} */
  const rejectedByReason = {};
  for (const [k, v] of Object.entries(rejectedAfter)) if (v - (rejectedBefore[k] ?? 0) > 0) rejectedByReason[k] = v - (rejectedBefore[k] ?? 0);
  const lost = overload.filter((o) => !o.complete && !clearRefusal(o));
  const priorityRatio = ratio(overloadTiers.priority.ttftP90Ms, unloadedTiers.priority.ttftP90Ms);
  // a tier nobody asked for refused nobody
  const refused = (/** @type {string} */ t) => (Number.isFinite(overloadTiers[t].refusedShare) ? overloadTiers[t].refusedShare : 0);
  const worstDeviation = Math.max(...shares.map((x) => Math.abs(x.deviation)).filter(Number.isFinite));
  return {
    scenario: 'tiers',
    settings: s,
    capacity: {
      concurrency: s.probeConcurrency,
      seconds: s.probeSeconds,
      completed: probe.filter((/** @type {Outcome} */ o) => o.complete).length,
      sustainablePerS: round(sustainable, 2),
      e2eP50Ms: round(
        percentile(
          probe.filter((/** @type {Outcome} */ o) => o.complete).map((/** @type {Outcome} */ o) => o.totalMs - o.edgeMs),
          50,
        ),
        1,
      ),
    },
    unloaded: { ratePerS: round(s.unloadedLoad * sustainable, 2), requests: unloaded.length, tiers: unloadedTiers },
    overload: { ratePerS: round(s.load * sustainable, 2), requests: overload.length, tiers: overloadTiers, keys: shares, rejectedByReason, drainedMs: drained },
    upstream,
    engines,
    signals,
    lost: lost.length,
    lostSamples: lost.slice(0, 5).map((o) => ({ id: o.id, status: o.status, code: o.code, error: o.error })),
    goals: {
      priorityTtftP90: {
        unloadedMs: unloadedTiers.priority.ttftP90Ms,
        overloadMs: overloadTiers.priority.ttftP90Ms,
        ratio: priorityRatio,
        target: GOALS.priorityTtftP90Ratio,
        met: priorityRatio <= GOALS.priorityTtftP90Ratio,
      },
      flexShedFirst: {
        refusedShare: Object.fromEntries(TIERS.map((t) => [t, refused(t)])),
        met: refused('flex') >= refused('default') && refused('default') >= refused('priority') && refused('priority') <= 0.01,
      },
      fairShare: { worstDeviation: round(worstDeviation, 3), target: GOALS.fairShareDeviation, met: worstDeviation <= GOALS.fairShareDeviation },
      lost: { count: lost.length, met: lost.length === 0 },
      nothingHeldUpstream: {
        met:
          upstream.legsOfRefused === 0 &&
          upstream.legsBeforeWaitEnded === 0 &&
          upstream.legsTimed === upstream.legs &&
          upstream.requestsReached === upstream.admitted &&
          Number.isFinite(drained),
      },
    },
  };
}

const yes = (/** @type {boolean} */ met) => (met ? 'yes' : 'NO');

/** The scenario's tables from its report (also `npm run bench -- docs`). @param {any} r */
export function tiersTable(r) {
  const g = r.goals;
  const goals = markdownTable(
    ['goal (issue 23)', 'measured', 'met'],
    [
      [
        'priority TTFT p90 overloaded / unloaded <= 1.5',
        `${g.priorityTtftP90.overloadMs} / ${g.priorityTtftP90.unloadedMs} ms = ${g.priorityTtftP90.ratio}`,
        yes(g.priorityTtftP90.met),
      ],
      ['flex shed first (refused share flex >= default >= priority ~ 0)', TIERS.map((t) => `${t} ${g.flexShedFirst.refusedShare[t]}`).join(', '), yes(g.flexShedFirst.met)],
      ['each key admitted within 10% of its fair count', `worst ${g.fairShare.worstDeviation}`, yes(g.fairShare.met)],
      ['0 lost', String(g.lost.count), yes(g.lost.met)],
      [
        'nothing held upstream by a queued request',
        `${r.upstream.requestsReached} requests reached the engines, ${r.upstream.admitted} admitted; legs of refused requests ${r.upstream.legsOfRefused}, sent before the wait ended ${r.upstream.legsBeforeWaitEnded} (of ${r.upstream.legsTimed} timed); idle ${r.overload.drainedMs} ms after the last answer`,
        yes(g.nothingHeldUpstream.met),
      ],
    ],
  );
  const phases = markdownTable(
    [
      'phase',
      'rate /s',
      'requests',
      'tier',
      'arrived',
      'admitted',
      'refused (share)',
      'waited at the edge',
      'edge wait p50 / p90 ms',
      'TTFT p50 / p90 ms',
      'TTFT less the edge wait, p90 ms',
    ],
    ['unloaded', 'overload'].flatMap((phase) =>
      TIERS.map((t) => {
        const x = r[phase].tiers[t];
        const refused = Object.entries(x.refused)
          .map(([code, count]) => `${code} ${count}`)
          .join(', ');
        return [
          phase,
          r[phase].ratePerS,
          r[phase].requests,
          t,
          x.arrived,
          x.admitted,
          `${refused || '0'} (${x.refusedShare})`,
          x.waitedAtEdge,
          `${x.edgeP50Ms} / ${x.edgeP90Ms}`,
          `${x.ttftP50Ms} / ${x.ttftP90Ms}`,
          x.pastEdgeP90Ms,
        ];
      }),
    ),
  );
  const keys = markdownTable(
    ['key', 'share of arrivals', 'arrived', 'admitted', 'fair (max-min per tier)', 'admitted share', 'fair share', 'admitted / fair - 1'],
    r.overload.keys.map((/** @type {any} */ k, /** @type {number} */ i) => [k.key, KEY_MIX[i], k.arrived, k.admitted, k.fair, k.admittedShare, k.fairShare, k.deviation]),
  );
  const reasons =
    Object.entries(r.overload.rejectedByReason)
      .map(([k, v]) => `${k} ${v}`)
      .join(', ') || 'none';
  const ages = (/** @type {any} */ a) => (a ? `age p50 ${a.ageP50Ms} ms, max ${a.maxAgeMs} ms, stale (the guard open) in ${a.stale} of ${a.samples} samples` : 'not sampled');
  const capacity = `Sustainable rate: ${r.capacity.sustainablePerS} completions/s (closed loop of ${r.capacity.concurrency} clients for ${r.capacity.seconds} s, ${r.capacity.completed} completed; time past the edge p50 ${r.capacity.e2eP50Ms} ms). Refusals in the overload by reason/tier (the router's /metrics): ${reasons}. The decode nodes' engine signals as the router held them, sampled each second: capacity phase ${ages(r.signals?.capacity)}; overload ${ages(r.signals?.overload)}.`;
  const inside = markdownTable(
    ['phase/tier (admitted)', 'P queue ms', 'D queue ms (KV wait)', 'D legs that waited for KV', 'D first token ms', 'TPOT ms'],
    Object.entries(r.engines ?? {}).map(([k, e]) => [k, e.prefillQueueMs, `${e.decodeQueueMs} (${e.decodeKvWaitMs})`, e.decodeKvWaitedShare, e.decodeFirstTokenMs, e.tpotMs]),
  );
  return `${goals}\n\n${capacity}\n\n${phases}\n\n${keys}\n\nInside the engines (means, from their per-request figures):\n\n${inside}`;
}

/** @param {any} r */
function tiersChart(r) {
  return {
    title: 'TTFT p90 by tier, unloaded and at the overload (ms)',
    series: ['unloaded', 'overload'],
    figures: TIERS.map((t) => ({ name: t, values: [r.unloaded.tiers[t].ttftP90Ms || 0, r.overload.tiers[t].ttftP90Ms || 0] })),
  };
}
