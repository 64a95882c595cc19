// Runs the real Worker in workerd through Miniflare directly — the same runtime `wrangler dev`
// uses, without its dev proxy, inspector and file watcher — for benchmarks that measure the
// router itself. Started as a child process (its own process group, like `wrangler dev`) so
// the benchmark can find and measure the workerd it spawns.
//
//   node scripts/workerd-router.mjs <port> <persistDir> <cwd> <documentFile> [KEY=VALUE ...] [flags]
//
// flags (the benchmark's other Workers run the same way, so they are measured alike):
//   --entry PATH            the Worker's entry point (default <cwd>/src/index.ts)
//   --bare                  no KV and no Durable Object: a plain Worker (documentFile is ignored, pass -)
//   --inspector-port N      workerd's V8 inspector on 127.0.0.1:N (CPU profiles; bench/profile.mjs)
//   --ratelimit LIMIT/PERIOD a RATE_LIMITER binding (wrangler.toml's optional [[ratelimits]]), for tests
//
// <port> and N may be 0: workerd binds a free port itself, and the ready line names the ports it
// took (`ready on http://127.0.0.1:PORT inspector N`). A port picked by the caller beforehand can be
// taken by another process while esbuild bundles, before workerd binds it.
import { build } from 'esbuild';
import { readFileSync, mkdirSync } from 'node:fs';
import path from 'node:path';
import { Miniflare } from 'miniflare';

const positional = [];
/** @type {Record<string, string | true>} */
const flags = {};
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
  const arg = argv[i];
  if (!arg.startsWith('--')) positional.push(arg);
  else if (arg === '--bare') flags.bare = true;
  else flags[arg.slice(2)] = argv[++i];
}
const [port, persistDir, cwd, documentFile, ...varArgs] = positional;
const root = path.resolve(cwd ?? '.');
const outdir = path.join(persistDir, 'bundle');
mkdirSync(outdir, { recursive: true });
const bare = flags.bare === true;

// The settings of wrangler.toml (kept in step with it by hand: one KV, one SQLite Durable Object).
const toml = readFileSync(path.join(root, 'wrangler.toml'), 'utf8');
const compatibilityDate = /compatibility_date\s*=\s*"([^"]+)"/.exec(toml)?.[1] ?? '2026-04-26';
const compatibilityFlags = JSON.parse(/compatibility_flags\s*=\s*(\[[^\]]*\])/.exec(toml)?.[1] ?? '[]');

await build({
  entryPoints: [typeof flags.entry === 'string' ? path.resolve(flags.entry) : path.join(root, 'src/index.ts')],
  bundle: true,
  format: 'esm',
  platform: 'neutral',
  mainFields: ['module', 'main'],
  conditions: ['workerd', 'worker', 'browser'],
  external: ['cloudflare:*', 'node:*'],
  outfile: path.join(outdir, 'worker.mjs'),
  logLevel: 'warning',
});

/** A file of <root>/assets as the ASSETS binding serves it: 404 outside it or when missing. */
function staticAsset(/** @type {string} */ dir, /** @type {Request} */ request) {
  const base = path.join(dir, 'assets');
  const file = path.join(base, path.normalize(decodeURIComponent(new URL(request.url).pathname)));
  if (!file.startsWith(base + path.sep)) return new Response('not found', { status: 404 });
  try {
    const type = file.endsWith('.html') ? 'text/html; charset=utf-8' : 'application/octet-stream';
    return new Response(readFileSync(file), { headers: { 'content-type': type } });
  } catch {
    return new Response('not found', { status: 404 });
  }
}

const bindings = Object.fromEntries(varArgs.map((kv) => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)]));
const mf = new Miniflare({
  modules: true,
  modulesRoot: outdir,
  scriptPath: path.join(outdir, 'worker.mjs'),
  compatibilityDate,
  compatibilityFlags,
  host: '127.0.0.1',
  port: Number(port),
  ...(typeof flags['inspector-port'] === 'string' ? { inspectorPort: Number(flags['inspector-port']) } : {}),
  ...(bare
    ? {}
    : {
        kvNamespaces: ['NODES'],
        // as wrangler.toml binds them (SignalPoller: sharded polling of a pool past signals.shardAbove nodes)
        durableObjects: { CLUSTER_STATE: { className: 'ClusterState', useSQLite: true }, SIGNAL_POLLER: { className: 'SignalPoller', useSQLite: true } },
        // wrangler.toml's [assets] (the status page): files of assets/, read by the Worker through ASSETS
        serviceBindings: { ASSETS: (/** @type {Request} */ request) => staticAsset(root, request) },
        kvPersist: path.join(persistDir, 'kv'),
        durableObjectsPersist: path.join(persistDir, 'do'),
      }),
  bindings,
  ...(typeof flags.ratelimit === 'string'
    ? { ratelimits: { RATE_LIMITER: { simple: { limit: Number(flags.ratelimit.split('/')[0]), period: Number(flags.ratelimit.split('/')[1]) } } } }
    : {}),
});
const url = await mf.ready;
if (!bare) await (await mf.getKVNamespace('NODES')).put('nodes', readFileSync(documentFile, 'utf8'));
const inspector = typeof flags['inspector-port'] === 'string' ? ` inspector ${(await mf.getInspectorURL()).port}` : '';
console.log(`ready on ${url.origin}${inspector}`);

const stop = async () => {
  await mf.dispose().catch(() => undefined);
  process.exit(0);
};
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
