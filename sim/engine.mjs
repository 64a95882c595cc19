// A simulated OpenAI-compatible inference engine (vLLM / SGLang P/D legs or colocated) on
// 127.0.0.1: the public entry of the simulator's engine, its HTTP routes and its handle. Its
// parts live in sim/engine/: its state and options (state.mjs), the completion routes
// (completions.mjs) and the protocols they speak (vllm.mjs, mooncake.mjs, sglang.mjs: KV
// handles, the Mooncake flow, bootstrap rooms), faults (faults.mjs), the answer with its usage
// (answer.mjs), the requests into the step loop (requests.mjs), /metrics (metrics-page.mjs),
// what a cluster's engines share (registry.mjs); the other route families are in
// sim/endpoints.mjs. Under it runs the engine model of sim/model/: KV memory with the prefix cache
// in it (kv-memory), a continuous-batching step loop (scheduler) whose steps take the time the
// batch costs (step-time), KV transfers over the cluster's links (fabric), all on the cluster's
// simulated clock (clock), with the figures of a preset (sim/presets.mjs).
import http from 'node:http';
import { randomUUID } from 'node:crypto';
import { sendError, sendJson } from './wire.mjs';
import { MAX_LOG, handleCompletion } from './engine/completions.mjs';
import { metricsBody, serveMetrics } from './engine/metrics-page.mjs';
import { healthGeneration, submit } from './engine/requests.mjs';
import { createState, resetState, setOptions, statsOf } from './engine/state.mjs';

export { sendJson };
export { clusterTime, createRegistry } from './engine/registry.mjs';
export { expectedPrefix, promptDigest, promptOf, promptsOf } from './engine/prompt.mjs';
export { STRING_OPTIONS, TUNABLE_OPTIONS } from './engine/state.mjs';

/**
 * The engine's types (sim/engine/types.mjs), for the simulator's importers.
 * @typedef {import('./engine/types.mjs').EngineRole} EngineRole
 * @typedef {import('./engine/types.mjs').FaultMode} FaultMode
 * @typedef {import('./engine/types.mjs').Fault} Fault
 * @typedef {import('./engine/types.mjs').LegKind} LegKind
 * @typedef {import('./engine/types.mjs').EngineOptions} EngineOptions
 * @typedef {import('./engine/types.mjs').TunableOptions} TunableOptions
 * @typedef {import('./engine/types.mjs').Registry} Registry
 * @typedef {import('./engine/types.mjs').HeldKv} HeldKv
 * @typedef {import('./engine/types.mjs').TransferEntry} TransferEntry
 * @typedef {import('./engine/types.mjs').RoomEntry} RoomEntry
 * @typedef {import('./engine/types.mjs').RequestLogEntry} RequestLogEntry
 * @typedef {import('./engine/types.mjs').RequestStats} RequestStats
 * @typedef {import('./engine/types.mjs').Engine} Engine
 */

/**
 * Start one simulated engine; resolves once it listens.
 * @param {EngineOptions} options
 * @returns {Promise<Engine>}
 */
export async function startEngine(options) {
  const state = createState(options);
  const { id, role, host, models, registry, memory, core, cache, sockets } = state;

  const server = http.createServer({ keepAlive: true, noDelay: true }, (req, res) => {
    const url = new URL(req.url ?? '/', 'http://sim');
    const path = url.pathname;
    if (req.method === 'POST' && (path === '/v1/chat/completions' || path === '/v1/completions')) {
      handleCompletion(state, req, res, path).catch((error) => {
        state.stats.errors++;
        if (!res.headersSent) sendError(res, 500, String(error), 'server_error');
      });
      return;
    }
    // /v1/responses, /v1/embeddings, /tokenize, /detokenize, SGLang's /generate: sim/endpoints.mjs
    if (req.method === 'POST' && ['/v1/responses', '/v1/embeddings', '/tokenize', '/detokenize', '/generate'].includes(path)) {
      const hooks = {
        engine,
        options,
        registry,
        stats: () => state.stats,
        fault: () => state.fault,
        inflight: (/** @type {number} */ d) => void (state.inflight += d),
        record: (/** @type {RequestLogEntry} */ e) => void (state.log.push(e) > MAX_LOG && state.log.shift()),
        submit: (
          /** @type {'local' | 'prefill' | 'remote'} */ k,
          /** @type {{ hashes: string[], tokens: number, maxTokens: number, source?: string, freshTokens?: () => number | undefined }} */ o,
        ) => submit(state, k, o),
      };
      import('./endpoints.mjs')
        .then((m) => m.handleEndpoint(req, res, path, hooks))
        .catch((error) => {
          state.stats.errors++;
          if (!res.headersSent) sendError(res, 500, String(error), 'server_error');
        });
      return;
    }
    if (req.method === 'GET' && (path === '/health' || path === '/health_generate')) {
      req.resume();
      if (!state.fault.health) return sendJson(res, 503, { status: 'unhealthy' });
      if (path === '/health_generate' || state.healthGenerate) {
        healthGeneration(state).then(
          () => sendJson(res, 200, { status: 'ok' }),
          () => sendJson(res, 503, { status: 'unhealthy' }),
        );
        return;
      }
      return sendJson(res, 200, { status: 'ok' });
    }
    if (req.method === 'GET' && path === '/metrics') {
      req.resume();
      serveMetrics(state, res).catch(() => res.destroy());
      return;
    }
    if (req.method === 'GET' && path === '/query') {
      // the Mooncake bootstrap server of a vLLM P (kv_connector/v1/mooncake/mooncake_utils.py
      // MooncakeBootstrapServer.query: {dp_rank: {engine_id, worker_addr: {tp: {pp: addr}}}});
      // the simulator serves it on the engine's bootstrap port, which defaults to its HTTP port
      req.resume();
      return sendJson(res, 200, { 0: { engine_id: state.mooncakeEngineId, worker_addr: { 0: { 0: `${host}:${engine.port}` } } } });
    }
    if (req.method === 'GET' && path === '/v1/models') {
      req.resume();
      const created = Math.floor(Date.now() / 1000);
      return sendJson(res, 200, { object: 'list', data: models.map((m) => ({ id: m, object: 'model', created, owned_by: 'sim' })) });
    }
    if (req.method === 'GET' && path === '/_sim/stats') {
      req.resume();
      return sendJson(res, 200, engine.stats());
    }
    if (req.method === 'GET' && path === '/_sim/request-stats') {
      req.resume();
      return sendJson(res, 200, engine.requestStats());
    }
    if (req.method === 'GET' && path === '/_sim/requests') {
      req.resume();
      return sendJson(res, 200, state.log);
    }
    if (req.method === 'POST' && path === '/_sim/reset') {
      req.resume();
      engine.reset();
      return sendJson(res, 200, { ok: true });
    }
    req.resume();
    sendError(res, 404, `no route ${req.method} ${path}`, 'invalid_request_error');
  });
  server.on('connection', (socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
  });

  /** @param {number} port */
  function listen(port) {
    return new Promise((resolve, reject) => {
      const onError = (/** @type {Error} */ error) => reject(error);
      server.once('error', onError);
      server.listen(port, host, () => {
        server.off('error', onError);
        resolve(/** @type {import('node:net').AddressInfo} */ (server.address()).port);
      });
    });
  }

  const boundPort = /** @type {number} */ (await listen(options.port ?? 0));

  /** @type {Engine} */
  const engine = {
    id,
    role,
    host,
    port: boundPort,
    url: `http://${host}:${boundPort}`,
    bootstrapPort: options.bootstrapPort ?? boundPort,
    cache,
    running: true,
    mooncakeEngineId: state.mooncakeEngineId,
    stats: () => statsOf(state),
    setOptions: (o) => setOptions(state, o),
    requests: () => [...state.log],
    requestStats: () => Object.fromEntries(state.requestStats),
    metrics: (values) => metricsBody(state, values),
    setMetricsFault(f) {
      state.metricsFault = { mode: f.mode ?? 'none', values: f.values ?? {}, delayMs: f.delayMs ?? 5000, status: f.status ?? 500, bytes: f.bytes ?? 10_000_000 };
    },
    model: () => ({ figures: state.figures, memory, core, clock: state.time.clock, fabric: state.time.fabric }),
    reset: () => resetState(state),
    setFault(f) {
      state.fault = {
        mode: f.mode ?? 'none',
        count: f.count ?? Infinity,
        delayMs: f.delayMs ?? 1000,
        afterChunks: f.afterChunks ?? 2,
        health: f.health ?? true,
        status: f.status ?? 200,
        headers: f.headers ?? {},
        body: f.body ?? '',
        bytes: f.bytes ?? 16 << 20,
        newline: f.newline ?? true,
      };
    },
    async stop() {
      if (!engine.running) return;
      engine.running = false;
      const closed = new Promise((resolve) => server.close(() => resolve(undefined)));
      for (const socket of sockets) socket.destroy();
      await closed;
    },
    async start() {
      if (engine.running) return;
      await listen(engine.port);
      engine.running = true;
      // a restarted vLLM gets a new engine id (uuid4 unless configured: vllm/config/kv_transfer.py)
      if (options.mooncakeEngineId === undefined) engine.mooncakeEngineId = state.mooncakeEngineId = `vllm-${randomUUID()}`;
    },
    async close() {
      await engine.stop();
      core.close();
      if (registry.engines.get(id) === engine) registry.engines.delete(id);
    },
  };
  state.engine = engine;
  registry.engines.set(id, engine);
  return engine;
}
