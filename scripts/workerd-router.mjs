// Runs the real Worker in workerd through Miniflare directly — the same runtime `wrangler dev`
// uses, without its dev proxy, inspector and file watcher — for benchmarks that measure the
// router itself. Started as a child process (its own process group, like `wrangler dev`) so
// the benchmark can find and measure the workerd it spawns.
//
//   node scripts/workerd-router.mjs <port> <persistDir> <cwd> <documentFile> [KEY=VALUE ...]
import { build } from 'esbuild';
import { readFileSync, mkdirSync } from 'node:fs';
import path from 'node:path';
import { Miniflare } from 'miniflare';

const [port, persistDir, cwd, documentFile, ...varArgs] = process.argv.slice(2);
const root = path.resolve(cwd ?? '.');
const outdir = path.join(persistDir, 'bundle');
mkdirSync(outdir, { recursive: true });

// The settings of wrangler.toml (kept in step with it by hand: one KV, one SQLite Durable Object).
const toml = readFileSync(path.join(root, 'wrangler.toml'), 'utf8');
const compatibilityDate = /compatibility_date\s*=\s*"([^"]+)"/.exec(toml)?.[1] ?? '2026-04-26';
const compatibilityFlags = JSON.parse(/compatibility_flags\s*=\s*(\[[^\]]*\])/.exec(toml)?.[1] ?? '[]');

await build({
  entryPoints: [path.join(root, 'src/index.ts')],
  bundle: true,
  format: 'esm',
  platform: 'neutral',
  mainFields: ['module', 'main'],
  conditions: ['workerd', 'worker', 'browser'],
  external: ['cloudflare:*', 'node:*'],
  outfile: path.join(outdir, 'worker.mjs'),
  logLevel: 'warning',
});

const bindings = Object.fromEntries(varArgs.map((kv) => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)]));
const mf = new Miniflare({
  modules: true,
  modulesRoot: outdir,
  scriptPath: path.join(outdir, 'worker.mjs'),
  compatibilityDate,
  compatibilityFlags,
  host: '127.0.0.1',
  port: Number(port),
  kvNamespaces: ['NODES'],
  durableObjects: { CLUSTER_STATE: { className: 'ClusterState', useSQLite: true } },
  kvPersist: path.join(persistDir, 'kv'),
  durableObjectsPersist: path.join(persistDir, 'do'),
  bindings,
});
const url = await mf.ready;
await (await mf.getKVNamespace('NODES')).put('nodes', readFileSync(documentFile, 'utf8'));
console.log(`ready on ${url.origin}`);

const stop = async () => {
  await mf.dispose().catch(() => undefined);
  process.exit(0);
};
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
