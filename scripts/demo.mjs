// `npm start`: 2 prefill + 2 decode simulated vLLM engines and the real Worker under
// `wrangler dev`, all on 127.0.0.1. Ctrl-C stops everything.
import { randomBytes } from 'node:crypto';
import { startSimCluster } from '../sim/cluster.mjs';
import { startRouter } from './router-process.mjs';

const ROUTER_PORT = 8787;
const CONTROL_PORT = Number(process.env.SIM_CONTROL_PORT ?? 8300);
// real time per simulated ms: 1 makes a demo feel like a GPU (15 ms a token); lower is faster
const TIME_SCALE = Number(process.env.SIM_TIME_SCALE ?? 1);
// the admin API and the status page are off without ADMIN_TOKEN: the demo makes one per run
const ADMIN_TOKEN = process.env.ADMIN_TOKEN || randomBytes(12).toString('hex');

const ENGINES = [
  { id: 'p0', role: /** @type {const} */ ('prefill'), port: 8100 },
  { id: 'p1', role: /** @type {const} */ ('prefill'), port: 8101 },
  { id: 'd0', role: /** @type {const} */ ('decode'), port: 8200 },
  { id: 'd1', role: /** @type {const} */ ('decode'), port: 8201 },
];

const cluster = await startSimCluster({
  engines: ENGINES,
  controlPort: CONTROL_PORT,
  defaults: { models: ['sim-model'], timeScale: TIME_SCALE },
});

// cache_aware, the policy the benchmark finds most of the cache with (Mooncake trace: 0.359 of a
// 0.366 ceiling, affinity 0.132), so the status page shows a hit ratio; a document that names no
// policy still gets SPEC 2's affinity (docs/predicted.md)
const clusterDocument = {
  protocol: 'vllm',
  policy: { prefill: 'cache_aware', decode: 'cache_aware' },
  nodes: ENGINES.map((e) => ({ id: e.id, url: `http://127.0.0.1:${e.port}`, role: e.role })),
};

/** @type {Awaited<ReturnType<typeof startRouter>> | undefined} */
let router;
let stopping = false;
async function shutdown(code = 0) {
  if (stopping) return;
  stopping = true;
  console.log('\nstopping...');
  await router?.stop();
  await cluster.close();
  process.exit(code);
}
process.on('SIGINT', () => void shutdown(0));
process.on('SIGTERM', () => void shutdown(0));

console.log('simulated engines (vllm protocol, model sim-model, time scale %s):', TIME_SCALE);
for (const e of cluster.engines.values()) console.log(`  ${e.id.padEnd(3)} ${e.role.padEnd(8)} ${e.url}`);
console.log(`  control  ${cluster.controlUrl}  (GET /stats, GET /engines/:id/requests, POST /engines/:id/fault ...)`);
console.log(`starting the router (wrangler dev) on http://127.0.0.1:${ROUTER_PORT} ...`);

try {
  router = await startRouter({ port: ROUTER_PORT, clusterDocument, persistDir: '.wrangler/demo-state', vars: { ADMIN_TOKEN } });
} catch (error) {
  console.error(error instanceof Error ? error.message : error);
  await shutdown(1);
}

const u = router?.url;
console.log(`
router: ${u}   (cluster document: ${clusterDocument.nodes.map((n) => n.id).join(', ')})
status page: ${u}/status#token=${ADMIN_TOKEN}
             (or open ${u}/status and paste the token: ${ADMIN_TOKEN})

try:
  curl -s ${u}/v1/models
  curl -sN ${u}/v1/chat/completions -H 'content-type: application/json' \\
    -d '{"model":"sim-model","stream":true,"max_tokens":16,"messages":[{"role":"user","content":"hello"}]}'
  curl -s ${u}/v1/route -H 'content-type: application/json' \\
    -d '{"model":"sim-model","messages":[{"role":"user","content":"hello"}]}'
  curl -s ${u}/metrics
  curl -s ${u}/admin/status -H 'authorization: Bearer ${ADMIN_TOKEN}'
  curl -s ${cluster.controlUrl}/stats

Ctrl-C stops everything.`);
