// Starts a Worker in workerd through Miniflare with scripts/workerd-router.mjs — the router, the
// pass-through baseline Worker, or the Durable Object capacity driver — in its own process
// group, so its CPU time and memory can be read from /proc (bench/lib/proc.mjs).
import { spawn } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';

const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const CHILD_ENV = { ...process.env, WRANGLER_SEND_METRICS: 'false', CLOUDFLARE_CF_FETCH_ENABLED: 'false' };

/**
 * @typedef {object} WorkerdOptions
 * @property {number} port
 * @property {string} persistDir
 * @property {string} cwd holds wrangler.toml (and src/ when `entry` is not set)
 * @property {string} [entry] Worker entry point (default cwd/src/index.ts: the router)
 * @property {boolean} [bare] no KV, no Durable Object binding
 * @property {object} [clusterDocument] written to KV NODES/nodes (not with bare)
 * @property {Record<string, string | number | boolean>} [vars]
 * @property {number} [inspectorPort]
 * @property {number} [startTimeoutMs] default 90000
 * @property {(line: string) => void} [onOutput]
 */

/**
 * @param {WorkerdOptions} o
 * @returns {Promise<{ url: string, pid: number, inspectorPort?: number, output: () => string, stop: () => Promise<void> }>}
 */
export async function startWorkerd(o) {
  mkdirSync(o.persistDir, { recursive: true });
  let documentFile = '-';
  if (!o.bare) {
    documentFile = path.join(o.persistDir, 'nodes.json');
    writeFileSync(documentFile, JSON.stringify(o.clusterDocument ?? { nodes: [] }));
  }
  const args = [path.join(REPO_ROOT, 'scripts', 'workerd-router.mjs'), String(o.port), o.persistDir, o.cwd, documentFile];
  for (const [k, v] of Object.entries(o.vars ?? {})) args.push(`${k}=${v}`);
  if (o.entry) args.push('--entry', o.entry);
  if (o.bare) args.push('--bare');
  if (o.inspectorPort !== undefined) args.push('--inspector-port', String(o.inspectorPort));
  const child = spawn(process.execPath, args, { cwd: o.cwd, env: CHILD_ENV, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
  const pid = /** @type {number} */ (child.pid);
  /** @type {string[]} */
  const lines = [];
  const collect = (/** @type {Buffer} */ data) => {
    for (const line of data.toString('utf8').split('\n')) {
      if (!line) continue;
      lines.push(line);
      if (lines.length > 400) lines.shift();
      o.onOutput?.(line);
    }
  };
  child.stdout.on('data', collect);
  child.stderr.on('data', collect);
  let exited = false;
  const exit = new Promise((resolve) =>
    child.once('exit', () => {
      exited = true;
      resolve(undefined);
    }),
  );
  const kill = (/** @type {NodeJS.Signals} */ signal) => {
    try {
      process.kill(-pid, signal);
    } catch {
      // gone
    }
  };
  const killOnExit = () => kill('SIGKILL');
  process.once('exit', killOnExit);
  const stop = async () => {
    process.off('exit', killOnExit);
    if (!exited) {
      kill('SIGTERM');
      if (!(await Promise.race([exit.then(() => true), sleep(5000).then(() => false)]))) kill('SIGKILL');
    }
    kill('SIGKILL');
  };
  const deadline = Date.now() + (o.startTimeoutMs ?? 90000);
  while (Date.now() < deadline && !exited) {
    if (lines.some((l) => l.startsWith('ready on '))) return { url: `http://127.0.0.1:${o.port}`, pid, inspectorPort: o.inspectorPort, output: () => lines.join('\n'), stop };
    await sleep(100);
  }
  await stop();
  throw new Error(`workerd (${o.entry ?? 'router'}) did not start ${exited ? '(it exited)' : 'in time'}:\n${lines.slice(-40).join('\n')}`);
}
