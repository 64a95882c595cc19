// `soak`: does the Worker's memory stay flat while clients come and go for minutes? (issue 25,
// item 1: workerd's RSS grew 66 -> 547 MB in a 5-minute soak and stayed there when idle, because
// every request a client left mid-stream was kept alive by the error of its aborted body read).
//
// The router in workerd over real TCP, 2 P + 2 D simulated engines streaming a token every 2 ms,
// `--concurrency` clients in a closed loop for `--minutes`, each request one of (seeded):
//   complete   a stream read to its end                              (30%)
//   mid-stream the client closes its socket after D's first tokens   (40%)
//   early      the client closes its socket before any answer byte   (15%)
//   whole      a non-streaming answer                                 (15%)
// Sampled every --sample-s: workerd's RSS (/proc); at the end of the first minute and at the end
// (idle, leases returned): the isolate's heap after forced collections, through the inspector
// (scripts/devtools.mjs). Reports the RSS slope after the first minute (MB a minute, least
// squares) and the heap grown per request between the two heap readings.
//
// `npm run bench -- soak [--minutes 5] [--concurrency 48] [--sample-s 5] [--seed 25] [--shares 0.3,0.4,0.15,0.15]
//   [--json bench/results/soak.json]`
import { readFile, readdir } from 'node:fs/promises';
import http from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { devtoolsSession, heapAfterGc, heapObjectBytes } from '../../scripts/devtools.mjs';
import { numberOption } from '../lib/args.mjs';
import { startStack } from '../lib/harness.mjs';
import { markdownTable } from '../lib/report.mjs';
import { mulberry32 } from '../lib/text.mjs';

const ADMIN_TOKEN = 'soak-admin-token';
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

/** workerd's RSS (KB): the workerd child of the router's Miniflare process. @param {number} routerPid */
async function workerdRssKb(routerPid) {
  try {
    const tasks = await readdir(`/proc/${routerPid}/task`);
    const children = (await Promise.all(tasks.map((t) => readFile(`/proc/${routerPid}/task/${t}/children`, 'utf8').catch(() => '')))).join(' ');
    for (const pid of children.trim().split(/\s+/).filter(Boolean)) {
      const status = await readFile(`/proc/${pid}/status`, 'utf8').catch(() => '');
      if (/^Name:\s*workerd/m.test(status)) return Number(/VmRSS:\s*(\d+)/.exec(status)?.[1]);
    }
  } catch {
    // not readable
  }
  return Number.NaN;
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

/** @param {Record<string, string | true>} options */
export async function runSoak(options) {
  const minutes = numberOption(options, 'minutes', 5);
  const concurrency = numberOption(options, 'concurrency', 48);
  const sampleS = numberOption(options, 'sample-s', 5);
  const rand = mulberry32(numberOption(options, 'seed', 25));
  // --shares a,b,c,d: complete, mid-stream, early, whole (e.g. 1,0,0,0: nobody leaves)
  const shares = typeof options.shares === 'string' ? options.shares.split(',').map(Number) : SHARES;
  if (shares.length !== KINDS.length || !shares.every((x) => x >= 0) || !(shares.reduce((a, b) => a + b, 0) > 0))
    throw new Error('--shares: four numbers >= 0 (complete, mid-stream, early, whole)');
  const stack = await startStack({
    engines: [
      { id: 'p0', role: 'prefill' },
      { id: 'p1', role: 'prefill' },
      { id: 'd0', role: 'decode' },
      { id: 'd1', role: 'decode' },
    ],
    // D writes a token every 2 ms: a 200-token answer is still streaming when a client leaves
    defaults: { decodeBaseMs: 2, decodeMsPerSeq: 0, transferInterferenceMs: 0, transferMsPerBlock: 0 },
    vars: { ADMIN_TOKEN },
  });
  const url = new URL(stack.router.url);
  const session = await devtoolsSession(/** @type {number} */ (stack.router.inspectorPort));
  /** @type {Record<string, Record<string, number>>} */
  const outcomes = Object.fromEntries(KINDS.map((k) => [k, {}]));
  let sent = 0;
  /** @type {{ tS: number, rssMb: number }[]} */
  const rss = [];
  const started = performance.now();
  const elapsedS = () => (performance.now() - started) / 1000;
  const endS = minutes * 60;
  /** @type {{ tS: number, heapBytes: number, objectBytes: number, requests: number } | undefined} */
  let atMinute;
  /** RSS right after forced collections, once a minute: what workerd keeps, not garbage V8 has yet to collect */
  /** @type {{ tS: number, rssMb: number, heapBytes: number }[]} */
  const afterGc = [];
  const rssMb = async () => Math.round((await workerdRssKb(stack.router.pid)) / 102.4) / 10;
  const sampler = (async () => {
    while (elapsedS() < endS) {
      rss.push({ tS: Math.round(elapsedS()), rssMb: await rssMb() });
      if (elapsedS() >= Math.min(60, endS / 2) * (afterGc.length + 1)) {
        const requests = sent;
        const heapBytes = await heapAfterGc(session);
        afterGc.push({ tS: Math.round(elapsedS()), rssMb: await rssMb(), heapBytes });
        if (!atMinute) atMinute = { tS: Math.round(elapsedS()), heapBytes, objectBytes: (await heapObjectBytes(session)).bytes, requests };
      }
      await sleep(sampleS * 1000);
    }
  })();
  const client = async () => {
    while (elapsedS() < endS) {
      const n = sent++;
      const kind = pickKind(rand, shares);
      const outcome = await oneRequest(url, kind, n);
      outcomes[kind][outcome] = (outcomes[kind][outcome] ?? 0) + 1;
    }
  };
  await Promise.all([sampler, ...Array.from({ length: concurrency }, client)]);
  // idle: every lease returned and every engine's connection closed
  const admin = { authorization: `Bearer ${ADMIN_TOKEN}` };
  let idleAfterMs = Number.NaN;
  const idleStart = performance.now();
  while (performance.now() - idleStart < 30_000) {
    const { leases } = /** @type {any} */ (await (await fetch(`${stack.router.url}/admin/status`, { headers: admin })).json());
    const engines = /** @type {Record<string, { inflight: number }>} */ (await stack.stats());
    if (leases === 0 && Object.values(engines).every((e) => e.inflight === 0)) {
      idleAfterMs = Math.round(performance.now() - idleStart);
      break;
    }
    await sleep(200);
  }
  const heapEnd = await heapAfterGc(session);
  const objectsEnd = (await heapObjectBytes(session)).bytes;
  const rssIdleMb = await rssMb();
  afterGc.push({ tS: Math.round(elapsedS()), rssMb: rssIdleMb, heapBytes: heapEnd });
  session.close();
  await stack.close();

  const after = rss.filter((s) => s.tS >= 60 && Number.isFinite(s.rssMb));
  const firstMinute = rss.filter((s) => s.tS <= 60 && Number.isFinite(s.rssMb)).at(-1);
  const later = atMinute ? sent - atMinute.requests : 0;
  const result = {
    scenario: 'soak',
    minutes,
    concurrency,
    shares: Object.fromEntries(KINDS.map((k, i) => [k, shares[i]])),
    requests: sent,
    outcomes,
    rssMb: {
      start: rss[0]?.rssMb,
      atFirstMinute: firstMinute?.rssMb,
      maxAfterFirstMinute: after.length ? Math.max(...after.map((s) => s.rssMb)) : undefined,
      end: rss.at(-1)?.rssMb,
      idle: rssIdleMb,
      slopeMbPerMinuteAfterFirstMinute: Math.round(slope(after.map((s) => ({ x: s.tS / 60, y: s.rssMb }))) * 100) / 100,
      afterGc: afterGc.map((g) => ({ tS: g.tS, rssMb: g.rssMb, heapMb: Math.round(g.heapBytes / 1e5) / 10 })),
      afterGcSlopeMbPerMinute: Math.round(slope(afterGc.map((g) => ({ x: g.tS / 60, y: g.rssMb }))) * 100) / 100,
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
  const chart = {
    title: `workerd RSS over a ${minutes}-minute soak at concurrency ${concurrency} (MB)`,
    series: ['RSS MB'],
    figures: [
      { name: 'start', values: [result.rssMb.start ?? 0] },
      { name: 'at 1 min', values: [result.rssMb.atFirstMinute ?? 0] },
      { name: 'max after 1 min', values: [result.rssMb.maxAfterFirstMinute ?? 0] },
      { name: 'idle at the end', values: [result.rssMb.idle] },
    ],
  };
  return { report: result, table: soakTable(result), chart };
}

/** The soak's table from its report (also `npm run bench -- docs`). @param {any} result */
export function soakTable(result) {
  const rows = [
    [
      'length, clients, mix (complete / mid-stream / early / whole)',
      `${result.minutes} min, ${result.concurrency}, ${result.shares ? KINDS.map((k) => result.shares[k]).join(' / ') : SHARES.join(' / ')}`,
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
    ['RSS right after forced GC, each minute (MB)', result.rssMb.afterGc.map((g) => g.rssMb).join(' / ')],
    ['slope of RSS after forced GC', `${result.rssMb.afterGcSlopeMbPerMinute} MB/min`],
    ['JS objects after GC, per request after the first minute', `${result.heap?.objectBytesPerRequest ?? '-'} B (${result.heap?.requestsBetween ?? 0} requests)`],
    ['whole heap after GC, per request after the first minute', `${result.heap?.heapBytesPerRequest ?? '-'} B`],
    ['leases and engine connections back to 0', Number.isFinite(result.idleAfterMs) ? `${result.idleAfterMs} ms after the last client` : 'NOT within 30 s'],
  ];
  return markdownTable(['soak', 'figure'], rows);
}
