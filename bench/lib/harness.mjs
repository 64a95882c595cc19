// One measured run: fresh simulated engines and a fresh router (its own temp state directory,
// so no Durable Object state carries over between policies), torn down afterwards or on Ctrl-C.
import { appendFileSync, cpSync, existsSync, mkdtempSync, rmSync, symlinkSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { pathToFileURL } from 'node:url';
import * as liveSim from '../../sim/cluster.mjs';
import { startRouter } from '../../scripts/router-process.mjs';

/** src/forward/lifecycle.ts PREFILL_REPORT_DELAY_MS (TypeScript, not importable here; test/node/prefill-report-delay.test.ts holds the two equal) */
export const PREFILL_REPORT_DELAY_MS = 250;

const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');

/** @type {Set<() => Promise<void>>} */
const cleanups = new Set();
let shuttingDown = false;

async function shutdown(/** @type {string} */ signal) {
  if (shuttingDown) return;
  shuttingDown = true;
  console.error(`\n${signal}: stopping the router and the engines...`);
  await Promise.allSettled([...cleanups].map((c) => c()));
  process.exit(signal === 'SIGINT' ? 130 : 143);
}
process.on('SIGINT', () => void shutdown('SIGINT'));
process.on('SIGTERM', () => void shutdown('SIGTERM'));

/**
 * Runs `cleanup` on Ctrl-C / SIGTERM (processes started outside startStack); returns the unregister.
 * @param {() => Promise<void>} cleanup
 */
export function onShutdown(cleanup) {
  cleanups.add(cleanup);
  return () => cleanups.delete(cleanup);
}

/** @type {string | undefined} */
let snapshotDir;
/** @type {Record<string, unknown> | undefined} */
let snapshotInfo;

/** Which Worker code a run measured: HEAD and the files of src/ changed since (read-only git). */
function gitState() {
  try {
    const head = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { cwd: REPO_ROOT, encoding: 'utf8' }).trim();
    const dirty = execFileSync('git', ['status', '--porcelain', '--', 'src', 'wrangler.toml'], { cwd: REPO_ROOT, encoding: 'utf8' })
      .split('\n')
      .filter(Boolean)
      .map((l) => l.slice(3));
    return { head, uncommittedSrc: dirty };
  } catch {
    return {};
  }
}

/** The Worker snapshot this process measured, for the JSON report. */
export function workerSource() {
  return snapshotInfo;
}

/**
 * A copy of the Worker's sources taken once per bench run. `wrangler dev` rebuilds and restarts
 * the Worker whenever a watched file changes ("Your worker restarted mid-request"), and other
 * people edit src/ while a benchmark runs; a snapshot keeps every policy on the same code.
 */
export function workerSnapshot() {
  if (snapshotDir) return snapshotDir;
  const dir = mkdtempSync(path.join(os.tmpdir(), 'pd-bench-worker-'));
  // BENCH_SRC=<commit> (run.mjs --src): the Worker as committed there, not the working tree that
  // others may be half-way through editing
  const commit = process.env.BENCH_SRC && process.env.BENCH_SRC !== 'worktree' ? process.env.BENCH_SRC : undefined;
  if (commit) {
    const archive = execFileSync('git', ['archive', '--format=tar', commit, 'src', 'sim', 'wrangler.toml', 'package.json', 'tsconfig.json'], {
      cwd: REPO_ROOT,
      maxBuffer: 256 * 1024 * 1024,
    });
    execFileSync('tar', ['-x', '-C', dir], { input: archive });
  }
  // bench/do-capacity-worker imports ../../src: it is built against the same copy
  for (const name of [...(commit ? [] : ['src', 'wrangler.toml', 'package.json', 'tsconfig.json']), 'bench/do-capacity-worker']) {
    const from = path.join(REPO_ROOT, name);
    if (existsSync(from)) cpSync(from, path.join(dir, name), { recursive: true });
  }
  symlinkSync(path.join(REPO_ROOT, 'node_modules'), path.join(dir, 'node_modules'), 'dir');
  snapshotDir = dir;
  snapshotInfo = {
    takenAt: new Date().toISOString(),
    ...(commit ? { commit: execFileSync('git', ['rev-parse', '--short', commit], { cwd: REPO_ROOT, encoding: 'utf8' }).trim() } : gitState()),
  };
  process.once('exit', () => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/**
 * The simulated engines: with BENCH_SRC (--src COMMIT), the sim/ of that commit too, so a run
 * measures one consistent tree while others edit sim/.
 * @type {(options: Parameters<typeof liveSim.startSimCluster>[0]) => ReturnType<typeof liveSim.startSimCluster>}
 */
export async function startSimCluster(options) {
  const commit = process.env.BENCH_SRC && process.env.BENCH_SRC !== 'worktree';
  const sim = commit ? /** @type {typeof liveSim} */ (await import(pathToFileURL(path.join(workerSnapshot(), 'sim', 'cluster.mjs')).href)) : liveSim;
  return sim.startSimCluster(options);
}

/** BENCH_ROUTER_LOG=FILE appends wrangler's output there (the router logs a line a request). */
function routerLog() {
  const file = process.env.BENCH_ROUTER_LOG;
  return file ? (/** @type {string} */ line) => appendFileSync(file, line + '\n') : undefined;
}

/** A port free right now on 127.0.0.1 (other runs may share the machine: never assume 8787). */
export function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = /** @type {net.AddressInfo} */ (s.address());
      s.close(() => resolve(port));
    });
  });
}

/**
 * @typedef {import('../../sim/cluster.mjs').EngineSpec} EngineSpec
 * @typedef {Awaited<ReturnType<typeof liveSim.startSimCluster>>} SimCluster
 * @typedef {Awaited<ReturnType<typeof startRouter>> & { inspectorPort: number }} Router
 * @typedef {{ cluster: SimCluster, router: Router, stats: () => Promise<Record<string, any>>, requestStats: () => Promise<Record<string, Record<string, any>>>, simNowMs: () => number, time: () => { clock: import('../../sim/model/clock.mjs').SimClock, holds: import('../../sim/model/router-holds.mjs').RouterHolds }, close: () => Promise<void> }} Stack
 */

/**
 * Start engines, then the router over them.
 * @param {object} options
 * @param {EngineSpec[]} options.engines
 * @param {Partial<EngineSpec>} [options.defaults]
 * @param {(engines: SimCluster['engines']) => object} [options.clusterDocument] built from the started engines (their ports)
 * @param {boolean} [options.router] default true; false = engines only
 * @param {Record<string, string | number | boolean>} [options.vars]
 * @returns {Promise<Stack>}
 */
export async function startStack({ engines, defaults = {}, clusterDocument, router: withRouter = true, vars = {} }) {
  const cluster = await startSimCluster({ engines, defaults });
  const persistDir = mkdtempSync(path.join(os.tmpdir(), 'pd-bench-'));
  /** @type {Router | undefined} */
  let router;
  let closed = false;
  const close = async () => {
    if (closed) return;
    closed = true;
    cleanups.delete(close);
    await router?.stop();
    await cluster.close();
    rmSync(persistDir, { recursive: true, force: true });
  };
  cleanups.add(close);
  try {
    if (withRouter) {
      const document = clusterDocument?.(cluster.engines) ?? defaultDocument(cluster.engines);
      // The router's deliberate delays are real ms while the engines' time runs 1 / timeScale as
      // fast: P's answer reported 250 ms late (src/forward/lifecycle.ts) would count its prefill
      // as running for 5 simulated s at time scale 0.05. Scaled, it is the production 250 ms.
      const timeScale = defaults.timeScale ?? 0;
      if (timeScale > 0) vars = { PREFILL_REPORT_DELAY_MS: Math.round(PREFILL_REPORT_DELAY_MS * timeScale), ...vars };
      const runtime = process.env.BENCH_RUNTIME === 'wrangler' ? 'wrangler' : 'workerd';
      // under workerd the router binds free ports itself (one picked here could be taken meanwhile)
      const ports = runtime === 'workerd' ? { port: 0, inspectorPort: 0 } : { port: await freePort(), inspectorPort: await freePort() };
      // either way the inspector port is set: the one passed, or the one workerd names
      router = /** @type {Router} */ (await startRouter({ runtime, cwd: workerSnapshot(), ...ports, persistDir, clusterDocument: document, vars, onOutput: routerLog() }));
    }
  } catch (error) {
    await close();
    throw error;
  }
  const control = async (/** @type {string} */ p) => (await fetch(cluster.controlUrl + p)).json();
  return {
    cluster,
    router: /** @type {Router} */ (router),
    stats: () => control('/stats'),
    requestStats: () => control('/request-stats'),
    // the engines' simulated clock (one per cluster; sim/model/clock.mjs)
    simNowMs: () => /** @type {any} */ ([...cluster.engines.values()][0]).model().clock.now(),
    // the cluster's clock and what stops it while the router has a request in hand (router-holds.mjs)
    time: () => /** @type {any} */ ([...cluster.registry.clocks.values()][0]),
    close,
  };
}

/** @param {SimCluster['engines']} engines */
function defaultDocument(engines) {
  return { nodes: [...engines.values()].map((e) => ({ id: e.id, url: e.url, role: e.role })) };
}

/**
 * The cluster document's `policy` for a policy name: it sets both legs.
 * @param {string} policy @param {Record<string, unknown>} [extra]
 */
export function policyFor(policy, extra = {}) {
  return { prefill: policy, decode: policy, ...extra };
}

/** The router's pid tree: workerd is a descendant of the wrangler process group. @param {number} pgid */
export async function processGroupMembers(pgid) {
  const { readdirSync, readFileSync } = await import('node:fs');
  /** @type {{ pid: number, comm: string }[]} */
  const out = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      const close = stat.lastIndexOf(')');
      const comm = stat.slice(stat.indexOf('(') + 1, close);
      const fields = stat.slice(close + 2).split(' ');
      if (Number(fields[2]) === pgid) out.push({ pid: Number(entry), comm });
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

/** VmRSS of a process in KB, NaN when gone. @param {number} pid */
export async function rssKb(pid) {
  const { readFileSync } = await import('node:fs');
  try {
    const m = /VmRSS:\s+(\d+)\s+kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) : NaN;
  } catch {
    return NaN;
  }
}
