import { mkdtempSync, rmSync, writeFileSync, mkdirSync } from 'node:fs';
import { execSync } from 'node:child_process';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { startRouter } from '../../scripts/router-process.mjs';

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
