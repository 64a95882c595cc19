// Runs the real Worker locally under `wrangler dev` (workerd), with the cluster document
// seeded into the local KV, for the demo, the benchmark and end-to-end tests.
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { stripVTControlCharacters } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';

const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

/** No internet here: wrangler must not phone home. */
const CHILD_ENV = { ...process.env, WRANGLER_SEND_METRICS: 'false', CLOUDFLARE_CF_FETCH_ENABLED: 'false' };

/** The repository's pinned wrangler (works from any cwd); `npx wrangler` when not installed. */
const LOCAL_WRANGLER = path.join(REPO_ROOT, 'node_modules', '.bin', 'wrangler');
const WRANGLER = existsSync(LOCAL_WRANGLER) ? { cmd: LOCAL_WRANGLER, args: [] } : { cmd: 'npx', args: ['wrangler'] };

/**
 * @typedef {object} RouterOptions
 * @property {number} [port] default 8787 under `wrangler`, 0 under `workerd`; 0: the runtime binds a free port (the returned url names it)
 * @property {object | string} clusterDocument written to KV `NODES`, key `nodes` (objects are JSON-encoded)
 * @property {string} [persistDir] local state directory, default `.wrangler/state` (relative to cwd)
 * @property {Record<string, string | number | boolean>} [vars] passed as `--var KEY:VALUE`
 * @property {string} [cwd] directory holding wrangler.toml, default the repository root
 * @property {string} [config] a wrangler config file other than cwd/wrangler.toml
 * @property {number} [inspectorPort] devtools port (set it when running several routers at once; 0: a free one, returned under `workerd`)
 * @property {number} [startTimeoutMs] how long to wait for GET /healthz 200, default 90000
 * @property {(line: string) => void} [onOutput] receives wrangler's output lines (default: kept, shown on failure)
 * @property {{ limit: number, period: number }} [rateLimit] workerd runtime only: a RATE_LIMITER binding (simple limit a period)
 * @property {'wrangler' | 'workerd'} [runtime] `wrangler` (default): `wrangler dev`, as a developer runs it;
 *   `workerd`: the same Worker in workerd through Miniflare, without the dev proxy (scripts/workerd-router.mjs)
 */

/**
 * Seed the local KV, start `wrangler dev` (or workerd), wait until `GET /healthz` answers 200.
 * @param {RouterOptions} options
 * @returns {Promise<{ url: string, pid: number, inspectorPort?: number, output: () => string, stop: () => Promise<void> }>}
 */
export async function startRouter(options) {
  const { clusterDocument, vars = {}, cwd = REPO_ROOT, config, inspectorPort, startTimeoutMs = 90000, onOutput } = options;
  const persistDir = path.resolve(cwd, options.persistDir ?? '.wrangler/state');
  const deadline = Date.now() + startTimeoutMs;
  if (options.runtime === 'workerd') {
    const { worker, group } = await launchWorkerd({
      port: options.port,
      persistDir,
      cwd,
      clusterDocument,
      vars,
      inspectorPort,
      rateLimit: options.rateLimit,
      startTimeoutMs,
      onOutput,
    });
    // workerd-router.mjs seeds the KV before its ready line: the Worker serves at once (a workerd
    // that dies after it is reported at once, with its output and exit code)
    await untilHealthy({ ...worker, group }, deadline, 'workerd');
    return worker;
  }
  mkdirSync(persistDir, { recursive: true });
  const port = options.port ?? 8787;
  const configArgs = config ? ['--config', config] : [];
  const documentText = typeof clusterDocument === 'string' ? clusterDocument : JSON.stringify(clusterDocument);
  const put = await run(
    WRANGLER.cmd,
    [...WRANGLER.args, 'kv', 'key', 'put', 'nodes', documentText, '--binding', 'NODES', '--local', '--persist-to', persistDir, ...configArgs],
    cwd,
  );
  if (put.code !== 0) throw new Error(`wrangler kv key put failed (exit ${put.code}):\n${put.output}`);
  const args = [...WRANGLER.args, 'dev', '--ip', '127.0.0.1', '--port', String(port), '--persist-to', persistDir, '--show-interactive-dev-session=false', ...configArgs];
  if (inspectorPort !== undefined) args.push('--inspector-port', String(inspectorPort));
  for (const [key, value] of Object.entries(vars)) args.push('--var', `${key}:${value}`);
  const group = spawnGroup(WRANGLER.cmd, args, cwd, onOutput);
  let url = `http://127.0.0.1:${port}`;
  if (port === 0) {
    // wrangler binds a free port and names it: "[wrangler:info] Ready on http://127.0.0.1:PORT"
    url = '';
    while (!url && Date.now() < deadline && !group.exited()) {
      url = group.lines.map((l) => /Ready on (http:\/\/[\d.]+:\d+)/.exec(stripVTControlCharacters(l))?.[1]).find(Boolean) ?? '';
      if (!url) await sleep(100);
    }
    if (!url) throw new Error(`the router (wrangler) did not say where it listens ${await group.failed()}`);
  }
  const router = { url, pid: group.pid, inspectorPort, output: group.output, stop: group.stop };
  await untilHealthy({ ...router, group }, deadline, 'wrangler');
  return router;
}

/**
 * @typedef {object} WorkerdOptions
 * @property {number} [port] default 0: workerd binds a free port (the returned url names it)
 * @property {string} persistDir
 * @property {string} cwd holds wrangler.toml (and src/ when `entry` is not set)
 * @property {string} [entry] Worker entry point (default cwd/src/index.ts: the router)
 * @property {boolean} [bare] no KV, no Durable Object binding
 * @property {object | string} [clusterDocument] written to KV NODES/nodes (not with bare)
 * @property {Record<string, string | number | boolean>} [vars]
 * @property {number} [inspectorPort] 0: a free one (returned)
 * @property {{ limit: number, period: number }} [rateLimit]
 * @property {number} [startTimeoutMs] default 90000
 * @property {(line: string) => void} [onOutput]
 */

/**
 * A Worker in workerd through Miniflare (scripts/workerd-router.mjs), in its own process group,
 * resolved once its ready line is printed (KV seeded). workerd binds its ports itself by default,
 * so two runs on one machine never race for a port picked beforehand.
 * @param {WorkerdOptions} o
 * @returns {Promise<{ url: string, pid: number, inspectorPort?: number, output: () => string, stop: () => Promise<void> }>}
 */
export async function startWorkerd(o) {
  return (await launchWorkerd(o)).worker;
}

/**
 * startWorkerd's Worker and its process group (whether it exited, why it failed).
 * @param {WorkerdOptions} o
 */
async function launchWorkerd(o) {
  mkdirSync(o.persistDir, { recursive: true });
  let documentFile = '-';
  if (!o.bare) {
    documentFile = path.join(o.persistDir, 'nodes.json');
    const document = o.clusterDocument ?? { nodes: [] };
    writeFileSync(documentFile, typeof document === 'string' ? document : JSON.stringify(document));
  }
  const args = [path.join(REPO_ROOT, 'scripts', 'workerd-router.mjs'), String(o.port ?? 0), o.persistDir, o.cwd, documentFile];
  for (const [k, v] of Object.entries(o.vars ?? {})) args.push(`${k}=${v}`);
  if (o.entry) args.push('--entry', o.entry);
  if (o.bare) args.push('--bare');
  if (o.rateLimit) args.push('--ratelimit', `${o.rateLimit.limit}/${o.rateLimit.period}`);
  if (o.inspectorPort !== undefined) args.push('--inspector-port', String(o.inspectorPort));
  const group = spawnGroup(process.execPath, args, o.cwd, o.onOutput);
  const deadline = Date.now() + (o.startTimeoutMs ?? 90000);
  while (Date.now() < deadline) {
    // the ready line first: a Worker that printed it and died before this look started, and its
    // caller reports the death as such (untilHealthy), not as "did not start"
    const ready = group.lines.map((l) => /^ready on (\S+)(?: inspector (\d+))?/.exec(l)).find(Boolean);
    if (ready) {
      const inspectorPort = ready[2] === undefined ? undefined : Number(ready[2]);
      return { worker: { url: ready[1], pid: group.pid, inspectorPort, output: group.output, stop: group.stop }, group };
    }
    if (group.exited()) break;
    await sleep(100);
  }
  throw new Error(`workerd (${o.entry ?? 'router'}) did not start ${await group.failed()}`);
}

/**
 * Poll `GET /healthz` until 200; on failure stop the process and throw with its last output.
 * @param {{ url: string, group: ReturnType<typeof spawnGroup> }} router
 * @param {number} deadline @param {string} runtime
 */
async function untilHealthy(router, deadline, runtime) {
  while (Date.now() < deadline && !router.group.exited()) {
    try {
      const res = await fetch(`${router.url}/healthz`, { signal: AbortSignal.timeout(2000) });
      await res.arrayBuffer();
      if (res.status === 200) return;
    } catch {
      // not listening yet
    }
    await sleep(250);
  }
  throw new Error(`the router (${runtime}) did not answer GET /healthz 200 at ${router.url} ${await router.group.failed()}`);
}

/**
 * Spawn a command in its own process group (so stop() takes wrangler, esbuild and workerd down
 * together), keeping its last 400 output lines.
 * @param {string} cmd @param {string[]} args @param {string} cwd @param {((line: string) => void) | undefined} onOutput
 */
function spawnGroup(cmd, args, cwd, onOutput) {
  const child = spawn(cmd, args, { cwd, env: CHILD_ENV, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
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
  // 'exit' can come before the pipes are drained: the reason a process died is in what follows
  /** @type {Promise<void>} */
  const closed = new Promise((resolve) => child.once('close', () => resolve()));
  const killOnExit = () => killGroup(pid, 'SIGKILL');
  process.once('exit', killOnExit);

  async function stop() {
    process.off('exit', killOnExit);
    if (!exited) {
      killGroup(pid, 'SIGTERM');
      const done = await Promise.race([exit.then(() => true), sleep(5000).then(() => false)]);
      if (!done) {
        killGroup(pid, 'SIGKILL');
        await Promise.race([exit, sleep(2000)]);
      }
    }
    // workerd may outlive the npx/wrangler parent for a moment; make sure the group is gone
    killGroup(pid, 'SIGKILL');
  }

  return {
    pid,
    lines,
    exited: () => exited,
    output: () => lines.join('\n'),
    stop,
    /** Stop it, and say how it failed with its last output (all of it, when it exited by itself). */
    async failed() {
      const byItself = exited;
      if (byItself) await Promise.race([closed, sleep(2000)]);
      await stop();
      const code = child.exitCode ?? child.signalCode;
      return `${byItself ? `(it exited: ${code})` : 'in time'}:\n${lines.slice(-60).join('\n')}`;
    },
  };
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
