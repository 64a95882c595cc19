// `soak`: does the Worker's memory stay flat while clients come and go for minutes? (issue 25,
// item 1: workerd's RSS grew 66 -> 547 MB in a 5-minute soak and stayed there when idle, because
// every request a client left mid-stream was kept alive by the error of its aborted body read).
//
// The router in workerd over real TCP, 2 P + 2 D simulated engines streaming a token every 2 ms,
// `--concurrency` clients for `--minutes`, each request one of (seeded):
//   complete   a stream read to its end                              (30%)
//   mid-stream the client closes its socket after D's first tokens   (40%)
//   early      the client closes its socket before any answer byte   (15%)
//   whole      a non-streaming answer                                 (15%)
// Sampled every --sample-s: workerd's RSS and its anonymous part (/proc); once a minute and at the
// end (idle, leases returned): the isolate's heap after forced collections, through the inspector
// (scripts/devtools.mjs), and RSS right then. Reports the RSS slope after the first minute (MB a
// minute, least squares) and the heap grown per request between the first-minute and end readings.
//
// --target baseline: the same traffic through the pass-through baseline Worker
// (bench/baseline-worker: two plain fetch legs, no state), in its own workerd on the same engines;
// --target both: the router, then the baseline, one after the other in one run, and the ratio of
// their slopes: what the router adds to what workerd itself keeps under this load.
// --rate R: requests start at R a second (seeded kinds, at most --concurrency of them open), not
// in a closed loop. The comparison needs it (default 20 for baseline and both): local workerd
// never tells a Worker that a client left before its answer began (request.signal does not fire
// for a TCP client), so an early departure's legs run on after the client has gone on to its next
// request; a closed loop then sends as fast as the Worker answers, and through the lighter
// baseline those orphaned legs piled up on P without bound (the run that "never finished").
// --allocator: tcmalloc's own figures through gdb (bench/lib/tcmalloc.mjs) at each forced GC,
// and at the end what it gives back when asked to release its free pages.
//
// `npm run bench -- soak [--minutes 5] [--concurrency 48] [--sample-s 5] [--seed 25] [--shares 0.3,0.4,0.15,0.15]
//   [--target router|baseline|both] [--rate R] [--allocator] [--json bench/results/soak.json]`
import { mkdtempSync, rmSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { devtoolsSession, heapAfterGc, heapObjectBytes } from '../../scripts/devtools.mjs';
import { numberOption, stringOption } from '../lib/args.mjs';
import { onShutdown, startSimCluster, workerSnapshot } from '../lib/harness.mjs';
import { groupMembers } from '../lib/proc.mjs';
import { markdownTable } from '../lib/report.mjs';
import { allocatorFigures } from '../lib/tcmalloc.mjs';
import { mulberry32 } from '../lib/text.mjs';
import { startWorkerd } from '../lib/workerd.mjs';

const ADMIN_TOKEN = 'soak-admin-token';
const BASELINE_ENTRY = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'baseline-worker', 'index.js');
const KINDS = /** @type {const} */ (['complete', 'mid-stream', 'early', 'whole']);
const SHARES = [0.3, 0.4, 0.15, 0.15];

/** @param {() => number} rand @param {number[]} shares @returns {typeof KINDS[number]} */
function pickKind(rand, shares) {
  let x = rand() * shares.reduce((a, b) => a + b, 0);
  for (let i = 0; i < KINDS.length; i++) {
    x -= shares[i];
    if (x < 0) return KINDS[i];
  }
  return 'complete';
}

/**
 * One request on its own socket; the kind decides when the client leaves.
 * @param {URL} url @param {typeof KINDS[number]} kind @param {number} n
 * @returns {Promise<string>} how it ended: the status, or `left`
 */
function oneRequest(url, kind, n) {
  const stream = kind !== 'whole';
  const body = JSON.stringify({
    model: 'sim-model',
    stream,
    max_tokens: 200,
    messages: [{ role: 'user', content: `soak conversation ${n % 97}: question ${n}` }],
  });
  return new Promise((resolve) => {
    const req = http.request(
      {
        host: url.hostname,
        port: url.port,
        path: '/v1/chat/completions',
        method: 'POST',
        agent: false,
        headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) },
      },
      (res) => {
        let contentEvents = 0;
        res.on('data', (/** @type {Buffer} */ chunk) => {
          if (kind !== 'mid-stream') return;
          contentEvents += chunk.toString('utf8').split('"content":"').length - 1;
          if (contentEvents >= 2) {
            req.destroy();
            resolve('left');
          }
        });
        res.on('end', () => resolve(String(res.statusCode)));
        res.on('error', () => resolve('left'));
      },
    );
    req.on('error', () => resolve('left'));
    // a client gives up after a minute (counted: an answer that never ends is a finding)
    req.setTimeout(60_000, () => {
      req.destroy();
      resolve('timed-out');
    });
    req.end(body);
    if (kind === 'early') {
      setTimeout(() => {
        req.destroy();
        resolve('left');
      }, 5);
    }
  });
}

/** workerd's memory (MB, from /proc/PID/status): resident, and its anonymous part. @param {number} pid */
async function memoryMb(pid) {
  const status = await readFile(`/proc/${pid}/status`, 'utf8').catch(() => '');
  const kb = (/** @type {string} */ field) => Number(new RegExp(`${field}:\\s*(\\d+)`).exec(status)?.[1]);
  return { rssMb: Math.round(kb('VmRSS') / 102.4) / 10, anonMb: Math.round(kb('RssAnon') / 102.4) / 10 };
}

/** Least-squares slope of y over x. @param {{ x: number, y: number }[]} points */
function slope(points) {
  const n = points.length;
  if (n < 2) return Number.NaN;
  const mx = points.reduce((s, p) => s + p.x, 0) / n;
  const my = points.reduce((s, p) => s + p.y, 0) / n;
  const num = points.reduce((s, p) => s + (p.x - mx) * (p.y - my), 0);
  const den = points.reduce((s, p) => s + (p.x - mx) ** 2, 0);
  return den ? num / den : Number.NaN;
}

const round2 = (/** @type {number} */ x) => Math.round(x * 100) / 100;

/**
 * workerd hands an isolate its inspector messages when the isolate runs: an idle Worker with no
 * alarm or poll of its own (the baseline) answers a forced GC only at its next request, and the
 * soak's reading at the end waited for ever. While a call waits, a GET /healthz every 200 ms.
 * @template {{ send: (method: string, params?: object) => Promise<any> }} S @param {S} session @param {string} url @returns {S}
 */
function awake(session, url) {
  const send = async (/** @type {string} */ method, /** @type {object} */ params = {}) => {
    let answered = false;
    const answer = session.send(method, params).finally(() => (answered = true));
    void (async () => {
      while (!answered) {
        await sleep(200);
        if (!answered)
          await fetch(`${url}/healthz`).then(
            (r) => r.arrayBuffer(),
            () => undefined,
          );
      }
    })();
    return answer;
  };
  return { ...session, send };
}

/**
 * The router (its document: the four engines) or the baseline Worker, in its own workerd with an
 * inspector, on the running engines.
 * @param {'router' | 'baseline'} target @param {Awaited<ReturnType<typeof startSimCluster>>} cluster
 */
async function startTarget(target, cluster) {
  const persistDir = mkdtempSync(path.join(os.tmpdir(), `pd-soak-${target}-`));
  const engines = [...cluster.engines.values()];
  const urls = (/** @type {string} */ role) =>
    engines
      .filter((e) => e.role === role)
      .map((e) => e.url)
      .join(',');
  const common = { cwd: workerSnapshot(), persistDir, inspectorPort: 0 };
  const proc =
    target === 'router'
      ? await startWorkerd({ ...common, clusterDocument: { nodes: engines.map((e) => ({ id: e.id, url: e.url, role: e.role })) }, vars: { ADMIN_TOKEN } })
      : await startWorkerd({ ...common, entry: BASELINE_ENTRY, bare: true, vars: { P_URLS: urls('prefill'), D_URLS: urls('decode') } });
  const stop = async () => {
    unregister();
    await proc.stop();
    rmSync(persistDir, { recursive: true, force: true });
  };
  const unregister = onShutdown(stop);
  const workerd = groupMembers(proc.pid).find((m) => m.comm === 'workerd');
  if (!workerd) {
    await stop();
    throw new Error(`soak: no workerd process under the ${target}'s launcher`);
  }
  return { url: proc.url, pid: workerd.pid, inspectorPort: /** @type {number} */ (proc.inspectorPort), stop };
}

/** @param {Record<string, string | true>} options */
export async function runSoak(options) {
  const minutes = numberOption(options, 'minutes', 5);
  const concurrency = numberOption(options, 'concurrency', 48);
  const sampleS = numberOption(options, 'sample-s', 5);
  const seed = numberOption(options, 'seed', 25);
  // --shares a,b,c,d: complete, mid-stream, early, whole (e.g. 1,0,0,0: nobody leaves)
  const shares = typeof options.shares === 'string' ? options.shares.split(',').map(Number) : SHARES;
  if (shares.length !== KINDS.length || !shares.every((x) => x >= 0) || !(shares.reduce((a, b) => a + b, 0) > 0))
    throw new Error('--shares: four numbers >= 0 (complete, mid-stream, early, whole)');
  const target = stringOption(options, 'target', 'router');
  if (!['router', 'baseline', 'both'].includes(target)) throw new Error('--target: router, baseline or both');
  // 0: a closed loop (the router alone, as the first soaks ran)
  const rate = numberOption(options, 'rate', target === 'router' ? 0 : 20);
  const cluster = await startSimCluster({
    engines: [
      { id: 'p0', role: 'prefill' },
      { id: 'p1', role: 'prefill' },
      { id: 'd0', role: 'decode' },
      { id: 'd1', role: 'decode' },
    ],
    // D writes a token every 2 ms: a 200-token answer is still streaming when a client leaves
    defaults: { decodeBaseMs: 2, decodeMsPerSeq: 0, transferInterferenceMs: 0, transferMsPerBlock: 0 },
  });
  const unregister = onShutdown(() => cluster.close());
  const settings = { minutes, concurrency, sampleS, seed, shares, rate, allocator: options.allocator === true };
  /** @type {any[]} */
  const runs = [];
  try {
    for (const t of /** @type {('router' | 'baseline')[]} */ (target === 'both' ? ['router', 'baseline'] : [target])) {
      runs.push(await soakThrough(t, cluster, settings));
      process.stderr.write(
        `soak ${t}: RSS after forced GC ${runs
          .at(-1)
          .rssMb.afterGc.map((/** @type {any} */ g) => g.rssMb)
          .join(' / ')} MB, slope ${runs.at(-1).rssMb.afterGcSlopeMbPerMinute} MB/min\n`,
      );
    }
  } finally {
    unregister();
    await cluster.close();
  }
  const result = runs.length === 1 ? runs[0] : { scenario: 'soak', target, minutes, concurrency, rate, shares: runs[0].shares, runs, ratios: slopeRatios(runs[0], runs[1]) };
  const chart = {
    title: `workerd RSS over a ${minutes}-minute soak at concurrency ${concurrency} (MB)`,
    series: runs.map((r) => `${r.target} RSS MB`),
    figures: [
      { name: 'start', values: runs.map((r) => r.rssMb.start ?? 0) },
      { name: 'at 1 min', values: runs.map((r) => r.rssMb.atFirstMinute ?? 0) },
      { name: 'max after 1 min', values: runs.map((r) => r.rssMb.maxAfterFirstMinute ?? 0) },
      { name: 'idle at the end', values: runs.map((r) => r.rssMb.idle) },
    ],
  };
  return { report: result, table: soakTable(result), chart };
}

/** The router's slopes over the baseline's (same minutes, same paced traffic, same engines). @param {any} router @param {any} baseline */
function slopeRatios(router, baseline) {
  const ratio = (/** @type {number} */ a, /** @type {number} */ b) => (b > 0 ? round2(a / b) : null);
  return {
    afterGcSlope: ratio(router.rssMb.afterGcSlopeMbPerMinute, baseline.rssMb.afterGcSlopeMbPerMinute),
    rssSlope: ratio(router.rssMb.slopeMbPerMinuteAfterFirstMinute, baseline.rssMb.slopeMbPerMinuteAfterFirstMinute),
    idleRss: ratio(router.rssMb.idle, baseline.rssMb.idle),
  };
}

/**
 * One soak through one Worker.
 * @param {'router' | 'baseline'} target @param {Awaited<ReturnType<typeof startSimCluster>>} cluster
 * @param {{ minutes: number, concurrency: number, sampleS: number, seed: number, shares: number[], rate: number, allocator: boolean }} o
 */
async function soakThrough(target, cluster, { minutes, concurrency, sampleS, seed, shares, rate, allocator }) {
  const worker = await startTarget(target, cluster);
  const rand = mulberry32(seed);
  const url = new URL(worker.url);
  const session = awake(await devtoolsSession(worker.inspectorPort, 'core:user:'), worker.url);
  /** @type {Record<string, Record<string, number>>} */
  const outcomes = Object.fromEntries(KINDS.map((k) => [k, {}]));
  let sent = 0;
  /** @type {{ tS: number, rssMb: number, anonMb: number }[]} */
  const rss = [];
  const started = performance.now();
  const elapsedS = () => (performance.now() - started) / 1000;
  const endS = minutes * 60;
  /** @type {{ tS: number, heapBytes: number, objectBytes: number, requests: number } | undefined} */
  let atMinute;
  /** RSS right after forced collections, once a minute: what workerd keeps, not garbage V8 has yet to collect */
  /** @type {{ tS: number, rssMb: number, anonMb: number, heapBytes: number, embedderBytes: number, backingStoreBytes: number }[]} */
  const afterGc = [];
  const afterGcReading = async () => {
    const heapBytes = await heapAfterGc(session);
    // V8's C++ heap (workerd's wrappers: streams, requests) and ArrayBuffer backing stores
    const usage = await session.send('Runtime.getHeapUsage');
    const mem = await memoryMb(worker.pid);
    afterGc.push({ tS: Math.round(elapsedS()), ...mem, heapBytes, embedderBytes: usage.embedderHeapUsedSize, backingStoreBytes: usage.backingStorageSize });
    return heapBytes;
  };
  const sampler = (async () => {
    while (elapsedS() < endS) {
      rss.push({ tS: Math.round(elapsedS()), ...(await memoryMb(worker.pid)) });
      if (elapsedS() >= Math.min(60, endS / 2) * (afterGc.length + 1)) {
        const requests = sent;
        const heapBytes = await afterGcReading();
        if (!atMinute) atMinute = { tS: Math.round(elapsedS()), heapBytes, objectBytes: (await heapObjectBytes(session)).bytes, requests };
      }
      await sleep(sampleS * 1000);
    }
  })();
  const one = async (/** @type {number} */ n) => {
    const kind = pickKind(rand, shares);
    const outcome = await oneRequest(url, kind, n);
    outcomes[kind][outcome] = (outcomes[kind][outcome] ?? 0) + 1;
  };
  let lagMaxS = 0;
  const load =
    rate > 0
      ? (async () => {
          // paced: request n starts at n / rate seconds, or when one of the --concurrency open ones ends
          /** @type {Set<Promise<void>>} */
          const open = new Set();
          for (let n = 0; n / rate < endS; n++) {
            const wait = n / rate - elapsedS();
            if (wait > 0) await sleep(wait * 1000);
            while (open.size >= concurrency) await Promise.race(open);
            lagMaxS = Math.max(lagMaxS, elapsedS() - n / rate);
            sent++;
            const p = one(n).finally(() => open.delete(p));
            open.add(p);
          }
          await Promise.all(open);
        })()
      : Promise.all(
          Array.from({ length: concurrency }, async () => {
            while (elapsedS() < endS) await one(sent++);
          }),
        );
  await Promise.all([sampler, load]);
  // idle: every lease returned (the baseline holds none) and every engine's connection closed
  const admin = { authorization: `Bearer ${ADMIN_TOKEN}` };
  let idleAfterMs = Number.NaN;
  const idleStart = performance.now();
  while (performance.now() - idleStart < 30_000) {
    const leases = target === 'router' ? /** @type {any} */ (await (await fetch(`${worker.url}/admin/status`, { headers: admin })).json()).leases : 0;
    const engines = /** @type {Record<string, { inflight: number }>} */ (await (await fetch(`${cluster.controlUrl}/stats`)).json());
    if (leases === 0 && Object.values(engines).every((e) => e.inflight === 0)) {
      idleAfterMs = Math.round(performance.now() - idleStart);
      break;
    }
    await sleep(200);
  }
  const heapEnd = await afterGcReading();
  const idle = /** @type {typeof afterGc[number]} */ (afterGc.at(-1));
  const objectsEnd = (await heapObjectBytes(session)).bytes;
  // idle: what tcmalloc holds, and what it gives back when asked (a background release would);
  // gdb only now: calling into the allocator of a process stopped mid-request can deadlock it
  const released = allocator ? await allocatorFigures(worker.pid, { release: true }) : undefined;
  const afterRelease = released ? await memoryMb(worker.pid) : undefined;
  session.close();
  await worker.stop();

  const after = rss.filter((s) => s.tS >= 60 && Number.isFinite(s.rssMb));
  const firstMinute = rss.filter((s) => s.tS <= 60 && Number.isFinite(s.rssMb)).at(-1);
  const later = atMinute ? sent - atMinute.requests : 0;
  return {
    scenario: 'soak',
    target,
    minutes,
    concurrency,
    ...(rate > 0 ? { rate, scheduleLagMaxS: round2(lagMaxS) } : {}),
    shares: Object.fromEntries(KINDS.map((k, i) => [k, shares[i]])),
    requests: sent,
    outcomes,
    rssMb: {
      start: rss[0]?.rssMb,
      atFirstMinute: firstMinute?.rssMb,
      maxAfterFirstMinute: after.length ? Math.max(...after.map((s) => s.rssMb)) : undefined,
      end: rss.at(-1)?.rssMb,
      idle: idle.rssMb,
      slopeMbPerMinuteAfterFirstMinute: round2(slope(after.map((s) => ({ x: s.tS / 60, y: s.rssMb })))),
      afterGc: afterGc.map((g) => ({
        tS: g.tS,
        rssMb: g.rssMb,
        anonMb: g.anonMb,
        heapMb: Math.round(g.heapBytes / 1e5) / 10,
        embedderMb: Math.round(g.embedderBytes / 1e5) / 10,
        backingStoreMb: Math.round(g.backingStoreBytes / 1e5) / 10,
      })),
      afterGcSlopeMbPerMinute: round2(slope(afterGc.map((g) => ({ x: g.tS / 60, y: g.rssMb })))),
      ...(released && afterRelease ? { idleAllocator: released.before, idleAfterRelease: afterRelease.rssMb, idleAllocatorAfterRelease: released.afterRelease } : {}),
    },
    heap: atMinute && {
      atFirstMinuteBytes: atMinute.heapBytes,
      endBytes: heapEnd,
      objectBytesAtFirstMinute: atMinute.objectBytes,
      objectBytesEnd: objectsEnd,
      requestsBetween: later,
      objectBytesPerRequest: later ? Math.round((objectsEnd - atMinute.objectBytes) / later) : undefined,
      heapBytesPerRequest: later ? Math.round((heapEnd - atMinute.heapBytes) / later) : undefined,
    },
    idleAfterMs,
    rssSamples: rss,
  };
}

/** The soak's table from its report (also `npm run bench -- docs`): one column a Worker. @param {any} result */
export function soakTable(result) {
  const runs = result.runs ?? [result];
  const figures = runs.map(soakFigures);
  const rows = figures[0].map((/** @type {string[]} */ [what], /** @type {number} */ i) => [what, ...figures.map((f) => f[i][1])]);
  if (result.ratios) {
    rows.push(['router / baseline: slope of RSS after forced GC', String(result.ratios.afterGcSlope ?? '-')]);
    rows.push(['router / baseline: RSS slope, idle RSS', `${result.ratios.rssSlope ?? '-'}, ${result.ratios.idleRss ?? '-'}`]);
  }
  const header = result.runs ? ['soak', ...runs.map((/** @type {any} */ r) => r.target)] : ['soak', 'figure'];
  return markdownTable(
    header,
    rows.map((r) => (r.length < header.length ? [...r, ...Array(header.length - r.length).fill('')] : r)),
  );
}

/** The rows of one run: [what, figure]. @param {any} result @returns {string[][]} */
function soakFigures(result) {
  const rows = [
    [
      'length, clients, mix (complete / mid-stream / early / whole)',
      `${result.minutes} min, ${result.concurrency}${result.rate ? ` (paced: ${result.rate} requests/s)` : ''}, ${result.shares ? KINDS.map((k) => result.shares[k]).join(' / ') : SHARES.join(' / ')}`,
    ],
    ['requests (complete / mid-stream / early / whole)', `${result.requests} (${KINDS.map((k) => Object.values(result.outcomes[k]).reduce((a, b) => a + b, 0)).join(' / ')})`],
    [
      'how they ended',
      KINDS.map(
        (k) =>
          `${k}: ${
            Object.entries(result.outcomes[k])
              .map(([how, n]) => `${how} ${n}`)
              .join(', ') || '-'
          }`,
      ).join('; '),
    ],
    [
      'workerd RSS start / at 1 min / max after / end / idle MB',
      `${result.rssMb.start} / ${result.rssMb.atFirstMinute} / ${result.rssMb.maxAfterFirstMinute} / ${result.rssMb.end} / ${result.rssMb.idle}`,
    ],
    ['RSS slope after the first minute (garbage not yet collected included)', `${result.rssMb.slopeMbPerMinuteAfterFirstMinute} MB/min`],
    ['RSS right after forced GC, each minute (MB)', result.rssMb.afterGc.map((/** @type {any} */ g) => g.rssMb).join(' / ')],
    ['slope of RSS after forced GC', `${result.rssMb.afterGcSlopeMbPerMinute} MB/min`],
  ];
  // whether it levels off: the same slope over the readings from the third minute on (longer runs)
  const late = result.rssMb.afterGc.filter((/** @type {any} */ g) => g.tS >= 170);
  if (late.length >= 3)
    rows.push(['slope of RSS after forced GC from the third minute', `${round2(slope(late.map((/** @type {any} */ g) => ({ x: g.tS / 60, y: g.rssMb }))))} MB/min`]);
  const a = result.rssMb.afterGc;
  if (a[0]?.anonMb !== undefined) {
    rows.push(['anonymous part of that RSS (MB)', a.map((/** @type {any} */ g) => g.anonMb).join(' / ')]);
    rows.push([
      'V8 heap / C++ (embedder) heap / ArrayBuffer stores after GC, first and last (MB)',
      [a[0], a.at(-1)].map((g) => `${g.heapMb} / ${g.embedderMb} / ${g.backingStoreMb}`).join(' -> '),
    ]);
  }
  const t = result.rssMb.idleAllocator;
  if (t) {
    rows.push([
      'idle: tcmalloc in use / held free (page heap, caches) MB',
      `${t.inUseMb} / ${round2(t.heapMb - t.inUseMb)} (${t.pageHeapFreeMb}, ${round2(t.centralCacheFreeMb + t.transferCacheFreeMb + t.threadCacheFreeMb)})`,
    ]);
    rows.push(['idle RSS after tcmalloc releases its free pages', `${result.rssMb.idle} -> ${result.rssMb.idleAfterRelease} MB`]);
  }
  rows.push(
    ['JS objects after GC, per request after the first minute', `${result.heap?.objectBytesPerRequest ?? '-'} B (${result.heap?.requestsBetween ?? 0} requests)`],
    ['whole heap after GC, per request after the first minute', `${result.heap?.heapBytesPerRequest ?? '-'} B`],
    [
      result.target === 'baseline' ? 'engine connections back to 0' : 'leases and engine connections back to 0',
      Number.isFinite(result.idleAfterMs) ? `${result.idleAfterMs} ms after the last client` : 'NOT within 30 s',
    ],
  );
  return rows;
}
