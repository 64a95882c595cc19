import { mkdtempSync, rmSync, writeFileSync, mkdirSync } from 'node:fs';
import { execFileSync, execSync } from 'node:child_process';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { startRouter, startWorkerd } from '../../scripts/router-process.mjs';

// A stand-in Worker (not the product) so this checks the process plumbing on its own:
// KV seeding, --var, readiness on /healthz, and stop() taking the whole group down.
const dir = mkdtempSync(path.join(os.tmpdir(), 'router-process-'));
mkdirSync(path.join(dir, 'src'));
writeFileSync(
  path.join(dir, 'wrangler.toml'),
  'name = "router-process-test"\nmain = "src/index.js"\ncompatibility_date = "2026-04-26"\n[[kv_namespaces]]\nbinding = "NODES"\nid = "REPLACE_WITH_YOUR_KV_NAMESPACE_ID"\n',
);
writeFileSync(
  path.join(dir, 'src', 'index.js'),
  `export default { async fetch(req, env) {
    if (new URL(req.url).pathname === '/healthz') return new Response('ok');
    return Response.json({ nodes: await env.NODES.get('nodes'), mode: env.MODE });
  } };\n`,
);
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const freePort = () =>
  new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });

describe('startRouter', () => {
  it('seeds KV, passes vars, waits for /healthz and stops the whole process group', async () => {
    const port = await freePort();
    const document = { nodes: [{ id: 'p0', url: 'http://127.0.0.1:1', role: 'prefill' }] };
    const router = await startRouter({ port, cwd: dir, clusterDocument: document, persistDir: path.join(dir, 'state'), vars: { MODE: 'a:b' }, inspectorPort: await freePort() });
    try {
      expect(router.url).toBe(`http://127.0.0.1:${port}`);
      const seen = await (await fetch(router.url + '/')).json();
      expect(JSON.parse(seen.nodes)).toEqual(document);
      expect(seen.mode).toBe('a:b');
    } finally {
      await router.stop();
    }
    await expect(fetch(router.url + '/healthz')).rejects.toThrow();
    // nothing of the group still runs (exited workerd may linger as a zombie where init does not reap)
    const left = execSync(`ps -o stat= -g ${router.pid} || true`)
      .toString()
      .split('\n')
      .filter((s) => s.trim() && !s.trim().startsWith('Z'));
    expect(left).toEqual([]);
  }, 60000);
});

describe('startRouter on port 0', () => {
  it('wrangler dev binds a free port and the router url names it, seeded like any other', async () => {
    const document = { nodes: [{ id: 'd0', url: 'http://127.0.0.1:1', role: 'decode' }] };
    const router = await startRouter({ port: 0, inspectorPort: 0, cwd: dir, clusterDocument: document, persistDir: path.join(dir, 'state0') });
    try {
      expect(Number(new URL(router.url).port)).toBeGreaterThan(0);
      expect(JSON.parse((await (await fetch(router.url + '/')).json()).nodes)).toEqual(document);
    } finally {
      await router.stop();
    }
  }, 60000);
});

describe('startRouter under workerd', () => {
  // A router that dies between its ready line and GET /healthz (an OOM kill, a crash on the first
  // request) used to be reported only at the deadline, as if it had been slow: the poll did not
  // watch the process.
  it('a router killed after its ready line is reported at once, with how it exited', async () => {
    const persistDir = path.join(dir, 'killed-after-ready');
    const repo = path.resolve(path.dirname(new URL(import.meta.url).pathname), '../..');
    const killGroup = () => {
      const pid = Number(
        execFileSync('pgrep', ['-f', `workerd-router.mjs 0 ${persistDir}`])
          .toString()
          .trim()
          .split('\n')[0],
      );
      process.kill(-pid, 'SIGKILL');
    };
    const failure = await startRouter({
      runtime: 'workerd',
      cwd: repo,
      persistDir,
      clusterDocument: { nodes: [] },
      startTimeoutMs: 45000,
      onOutput: (line) => {
        if (line.startsWith('ready on')) killGroup();
      },
    }).then(
      (router) => (router.stop(), 'started'),
      (error) => String(error),
    );
    // not "within the deadline" (45 s), after waiting for it
    expect(failure).toMatch(/did not answer GET \/healthz 200 .* \(it exited: SIGKILL\)/);
  }, 60000);
});

describe('startWorkerd', () => {
  // The benchmark starts several routers at once beside engines binding ports of their own: a port
  // picked beforehand can be taken while esbuild bundles (CI saw a router exit so). workerd binds
  // free ports itself and its ready line names them.
  it('binds free ports itself: two Workers started at once serve on the ports they name, inspectors too', async () => {
    writeFileSync(path.join(dir, 'src', 'bare.js'), 'export default { fetch(req, env) { return Response.json({ mode: env.MODE }); } };\n');
    const start = (/** @type {string} */ name) =>
      startWorkerd({ cwd: dir, entry: path.join(dir, 'src', 'bare.js'), bare: true, persistDir: path.join(dir, name), vars: { MODE: name }, inspectorPort: 0 });
    const workers = await Promise.all([start('one'), start('two')]);
    try {
      const ports = workers.map((w) => Number(new URL(w.url).port));
      expect(ports.every((p) => p > 0)).toBe(true);
      expect(new Set([...ports, ...workers.map((w) => w.inspectorPort)]).size).toBe(4);
      for (const [i, w] of workers.entries()) {
        expect((await (await fetch(w.url + '/')).json()).mode).toBe(['one', 'two'][i]);
        // the inspector named is the Worker's own: it lists its target
        const targets = await (await fetch(`http://127.0.0.1:${w.inspectorPort}/json/list`)).json();
        expect(targets.length).toBeGreaterThan(0);
      }
    } finally {
      await Promise.all(workers.map((w) => w.stop()));
    }
  }, 60000);

  it('a Worker that exits before it is ready: the error carries why (its last output, read to the end)', async () => {
    writeFileSync(path.join(dir, 'src', 'broken.js'), 'export default { fetch( {\n');
    const failure = await startWorkerd({ cwd: dir, entry: path.join(dir, 'src', 'broken.js'), bare: true, persistDir: path.join(dir, 'broken') }).then(
      () => 'started',
      (error) => String(error),
    );
    expect(failure).toMatch(/did not start \(it exited: 1\)/);
    // esbuild's own message about the file, printed just before the process exited
    expect(failure).toMatch(/broken\.js/);
    expect(failure).toMatch(/ERROR|error/);
  }, 60000);
});
