// `do-capacity`: how many routed requests a second one ClusterState object sustains (issue 12,
// docs/scaling.md). A bench Worker (bench/do-capacity-worker) calls the real object's RPC
// methods as the router's hot path does — route (pick + lease), then finish (release) — many at
// a time, for clusters of 8, 64 and 512 nodes. workerd runs the Worker and the object on one
// thread here, so the figures are a floor for the object alone; `noop` (the cheapest RPC) is
// measured too, so the object's own work can be told from the cost of any call.
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ALL_POLICIES, listOption, numberOption } from '../lib/args.mjs';
import { onShutdown, workerSnapshot } from '../lib/harness.mjs';
import { createAgent, runPool } from '../lib/http-client.mjs';
import { cpuMeter } from '../lib/proc.mjs';
import { formatNumber, markdownTable } from '../lib/report.mjs';
import { percentile, round } from '../lib/stats.mjs';
import { startWorkerd } from '../lib/workerd.mjs';
import http from 'node:http';

export const OPS = ['noop', 'route_finish', 'request'];

/**
 * GET a JSON answer over a keep-alive agent.
 * @param {string} url @param {http.Agent} agent @returns {Promise<any>}
 */
function getJson(url, agent) {
  return new Promise((resolve, reject) => {
    http
      .get(url, { agent }, (res) => {
        let raw = '';
        res.setEncoding('utf8');
        res.on('data', (d) => (raw += d));
        res.on('end', () => (res.statusCode === 200 ? resolve(JSON.parse(raw)) : reject(new Error(`${res.statusCode}: ${raw.slice(0, 300)}`))));
      })
      .on('error', reject);
  });
}

/**
 * Figures of one point from what the driver saw and what workerd used.
 * @param {{ requests: number, calls: number, wallMs: number, cpuMs: number, requestMs: number[] }} s
 */
export function capacityFigures(s) {
  const perS = s.requests / (s.wallMs / 1000);
  return {
    requests: s.requests,
    requestsPerS: round(perS, 0),
    callsPerS: round(s.calls / (s.wallMs / 1000), 0),
    callsPerRequest: round(s.calls / Math.max(1, s.requests), 2),
    // the whole process (driver Worker + object + RPC) per routed request, and per call
    cpuUsPerRequest: round((s.cpuMs * 1000) / Math.max(1, s.requests), 1),
    cpuUsPerCall: round((s.cpuMs * 1000) / Math.max(1, s.calls), 1),
    cpuShare: round(s.cpuMs / s.wallMs, 2),
    requestMsP50: percentile(s.requestMs, 50),
    requestMsP99: percentile(s.requestMs, 99),
  };
}

/** @param {Record<string, string | true>} options */
export async function runDoCapacity(options) {
  const nodeCounts = String(options.nodes ?? '8,64,512')
    .split(',')
    .map(Number);
  const policies = listOption(options, 'policy', ALL_POLICIES, ['round_robin', 'least_load', 'cache_aware']);
  const ops = listOption(options, 'ops', OPS, ['noop', 'route_finish']);
  const seconds = numberOption(options, 'seconds', 5);
  const clients = numberOption(options, 'clients', 4);
  const batch = numberOption(options, 'batch', 64);
  const parallel = numberOption(options, 'parallel', 16);
  const snapshot = workerSnapshot();
  const persistDir = mkdtempSync(path.join(os.tmpdir(), 'pd-bench-capacity-'));
  const worker = await startWorkerd({
    cwd: snapshot,
    entry: path.join(snapshot, 'bench', 'do-capacity-worker', 'index.ts'),
    persistDir,
    clusterDocument: { nodes: [] },
  });
  const stop = async () => {
    await worker.stop();
    rmSync(persistDir, { recursive: true, force: true });
  };
  const unregister = onShutdown(stop);
  const agent = createAgent(clients);
  const results = [];
  try {
    /** @param {string} op @param {string} policy @param {number} nodes */
    const point = async (op, policy, nodes) => {
      const url = `${worker.url}/drive?op=${op}&policy=${policy}&nodes=${nodes}&requests=${batch}&parallel=${parallel}`;
      // warm: the object learns the cluster, the isolate compiles
      const warmUntil = performance.now() + Math.min(1000, seconds * 200);
      while (performance.now() < warmUntil) await getJson(url, agent);
      const s = { requests: 0, calls: 0, wallMs: 0, cpuMs: 0, requestMs: /** @type {number[]} */ ([]) };
      const cpu = cpuMeter(worker.pid);
      const started = performance.now();
      const until = started + seconds * 1000;
      await runPool(clients, clients, async () => {
        while (performance.now() < until) {
          const r = await getJson(url, agent);
          s.requests += r.requests;
          s.calls += r.calls;
          for (const ms of r.requestMs) s.requestMs.push(ms);
        }
      });
      s.wallMs = performance.now() - started;
      s.cpuMs = cpu.stop();
      const row = { op, policy: op === 'noop' ? '-' : policy, nodes: op === 'noop' ? '-' : nodes, ...capacityFigures(s) };
      process.stderr.write(
        `do-capacity ${op} ${row.policy} ${row.nodes} nodes: ${row.requestsPerS} requests/s, ${row.cpuUsPerRequest} us CPU a request (${row.cpuShare} of a core)\n`,
      );
      return row;
    };
    if (ops.includes('noop')) results.push(await point('noop', 'round_robin', 8));
    for (const policy of policies) {
      for (const nodes of nodeCounts) {
        for (const op of ops.filter((o) => o !== 'noop')) results.push(await point(op, policy, nodes));
      }
    }
  } finally {
    agent.destroy();
    unregister();
    await stop();
  }
  const noop = results.find((r) => r.op === 'noop');
  for (const r of results) {
    // the object's own work, roughly: the request's CPU less that of as many bare calls
    if (noop && r !== noop) Object.assign(r, { cpuUsPerRequestOverNoop: round(r.cpuUsPerRequest - noop.cpuUsPerCall * r.callsPerRequest, 1) });
  }
  const report = { scenario: 'do-capacity', config: { nodeCounts, policies, ops, seconds, clients, batch, parallel }, results };
  return {
    report,
    table: doCapacityTable(report),
    chart: {
      title: 'do-capacity: routed requests/s one ClusterState object sustains (Worker and object on one workerd thread)',
      series: results.filter((r) => r.op !== 'noop').map((r) => `${r.op} ${r.policy} ${r.nodes}`),
      figures: [
        {
          name: 'requests/s',
          values: results.filter((r) => r.op !== 'noop').map((r) => r.requestsPerS),
          ...(noop ? { reference: { value: noop.requestsPerS, label: 'bare RPC calls/s' } } : {}),
        },
      ],
    },
  };
}

/**
 * The table a run prints, from its report alone (`npm run bench -- docs` rebuilds it from the JSON).
 * @param {{ results: Record<string, any>[] }} report
 */
export function doCapacityTable({ results }) {
  return markdownTable(
    [
      'op',
      'policy',
      'nodes',
      'requests/s',
      'calls/s',
      'calls a request',
      'CPU us a request (over bare calls)',
      'CPU us a call',
      'workerd CPU share',
      'request ms p50 / p99 (Worker side)',
    ],
    results.map((r) => [
      r.op,
      r.policy,
      r.nodes,
      r.requestsPerS,
      r.callsPerS,
      r.callsPerRequest,
      r.op === 'noop' ? formatNumber(r.cpuUsPerRequest) : `${formatNumber(r.cpuUsPerRequest)} (${formatNumber(/** @type {any} */ (r).cpuUsPerRequestOverNoop)})`,
      r.cpuUsPerCall,
      r.cpuShare,
      `${formatNumber(r.requestMsP50)} / ${formatNumber(r.requestMsP99)}`,
    ]),
  );
}
