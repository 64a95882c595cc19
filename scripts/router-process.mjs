// Runs the real Worker locally under `wrangler dev` (workerd), with the cluster document
// seeded into the local KV, for the demo, the benchmark and end-to-end tests.
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';

const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

/** No internet here: wrangler must not phone home. */
const CHILD_ENV = { ...process.env, WRANGLER_SEND_METRICS: 'false', CLOUDFLARE_CF_FETCH_ENABLED: 'false' };

/** The repository's pinned wrangler (works from any cwd); `npx wrangler` when not installed. */
const LOCAL_WRANGLER = path.join(REPO_ROOT, 'node_modules', '.bin', 'wrangler');
const WRANGLER = existsSync(LOCAL_WRANGLER) ? { cmd: LOCAL_WRANGLER, args: [] } : { cmd: 'npx', args: ['wrangler'] };

/**
 * @typedef {object} RouterOptions
 * @property {number} [port] default 8787
 * @property {object | string} clusterDocument written to KV `NODES`, key `nodes` (objects are JSON-encoded)
 * @property {string} [persistDir] local state directory, default `.wrangler/state` (relative to cwd)
 * @property {Record<string, string | number | boolean>} [vars] passed as `--var KEY:VALUE`
 * @property {string} [cwd] directory holding wrangler.toml, default the repository root
 * @property {string} [config] a wrangler config file other than cwd/wrangler.toml
 * @property {number} [inspectorPort] devtools port (set it when running several routers at once)
 * @property {number} [startTimeoutMs] how long to wait for GET /healthz 200, default 90000
 * @property {(line: string) => void} [onOutput] receives wrangler's output lines (default: kept, shown on failure)
 * @property {{ limit: number, period: number }} [rateLimit] workerd runtime only: a RATE_LIMITER binding (simple limit a period)
 * @property {'wrangler' | 'workerd'} [runtime] `wrangler` (default): `wrangler dev`, as a developer runs it;
 *   `workerd`: the same Worker in workerd through Miniflare, without the dev proxy (scripts/workerd-router.mjs)
 */

/**
 * Seed the local KV, start `wrangler dev`, wait until `GET /healthz` answers 200.
 * @param {RouterOptions} options
 * @returns {Promise<{ url: string, pid: number, output: () => string, stop: () => Promise<void> }>}
 */
export async function startRouter(options) {
  const { port = 8787, clusterDocument, vars = {}, cwd = REPO_ROOT, config, inspectorPort, startTimeoutMs = 90000, onOutput } = options;
  const persistDir = path.resolve(cwd, options.persistDir ?? '.wrangler/state');
  mkdirSync(persistDir, { recursive: true });
  const configArgs = config ? ['--config', config] : [];
  const documentText = typeof clusterDocument === 'string' ? clusterDocument : JSON.stringify(clusterDocument);

  let command;
  if (options.runtime === 'workerd') {
    const documentFile = path.join(persistDir, 'nodes.json');
    writeFileSync(documentFile, documentText);
    const varArgs = Object.entries(vars).map(([key, value]) => `${key}=${value}`);
    const rateLimitArgs = options.rateLimit ? ['--ratelimit', `${options.rateLimit.limit}/${options.rateLimit.period}`] : [];
    const inspectorArgs = inspectorPort !== undefined ? ['--inspector-port', String(inspectorPort)] : [];
    command = {
      cmd: process.execPath,
      args: [path.join(REPO_ROOT, 'scripts', 'workerd-router.mjs'), String(port), persistDir, cwd, documentFile, ...varArgs, ...rateLimitArgs, ...inspectorArgs],
    };
  } else {
    const put = await run(
      WRANGLER.cmd,
      [...WRANGLER.args, 'kv', 'key', 'put', 'nodes', documentText, '--binding', 'NODES', '--local', '--persist-to', persistDir, ...configArgs],
      cwd,
    );
    if (put.code !== 0) throw new Error(`wrangler kv key put failed (exit ${put.code}):\n${put.output}`);
    const args = [...WRANGLER.args, 'dev', '--ip', '127.0.0.1', '--port', String(port), '--persist-to', persistDir, '--show-interactive-dev-session=false', ...configArgs];
    if (inspectorPort !== undefined) args.push('--inspector-port', String(inspectorPort));
    for (const [key, value] of Object.entries(vars)) args.push('--var', `${key}:${value}`);
    command = { cmd: WRANGLER.cmd, args };
  }

  // its own process group, so stop() can take wrangler, esbuild and workerd down together
  const child = spawn(command.cmd, command.args, { cwd, env: CHILD_ENV, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
  const pid = /** @type {number} */ (child.pid);
  /** @type {string[]} */
  const lines = [];
  const collect = (/** @type {Buffer} */ data) => {
    for (const line of data.toString('utf8').split('\n')) {
      if (!line) continue;
      lines.push(line);
      if (lines.length > 400) lines.shift();
      onOutput?.(line);
    }
  };
  child.stdout.on('data', collect);
  child.stderr.on('data', collect);
  let exited = false;
  /** @type {Promise<void>} */
  const exit = new Promise((resolve) =>
    child.once('exit', () => {
      exited = true;
      resolve();
    }),
  );
  const killOnExit = () => killGroup(pid, 'SIGKILL');
  process.once('exit', killOnExit);

  async function stop() {
    process.off('exit', killOnExit);
    if (exited) return;
    killGroup(pid, 'SIGTERM');
    const done = await Promise.race([exit.then(() => true), sleep(5000).then(() => false)]);
    if (!done) {
      killGroup(pid, 'SIGKILL');
      await Promise.race([exit, sleep(2000)]);
    }
    // workerd may outlive the npx/wrangler parent for a moment; make sure the group is gone
    killGroup(pid, 'SIGKILL');
  }

  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + startTimeoutMs;
  while (Date.now() < deadline) {
    if (exited) break;
    try {
      const res = await fetch(`${url}/healthz`, { signal: AbortSignal.timeout(2000) });
      await res.arrayBuffer();
      // workerd-router.mjs seeds the KV once workerd listens: its "ready" line says it is done
      const seeded = options.runtime !== 'workerd' || lines.some((l) => l.startsWith('ready on '));
      if (res.status === 200 && seeded) return { url, pid, output: () => lines.join('\n'), stop };
    } catch {
      // not listening yet
    }
    await sleep(250);
  }
  await stop();
  throw new Error(
    `the router (${options.runtime ?? 'wrangler'}) did not answer GET /healthz 200 at ${url} ${exited ? '(it exited)' : `within ${startTimeoutMs} ms`}:\n${lines.slice(-60).join('\n')}`,
  );
}

/** @param {number} pid @param {NodeJS.Signals} signal */
function killGroup(pid, signal) {
  try {
    process.kill(-pid, signal);
  } catch {
    // already gone
  }
}

/**
 * @param {string} cmd @param {string[]} args @param {string} cwd
 * @returns {Promise<{ code: number | null, output: string }>}
 */
function run(cmd, args, cwd) {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { cwd, env: CHILD_ENV, stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    child.stdout.on('data', (d) => (output += d));
    child.stderr.on('data', (d) => (output += d));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, output }));
  });
}
