// Several simulated engines in one Node process, sharing one registry (locality misses,
// SGLang rendezvous, the simulated clock and the network links), plus a control HTTP server so
// tests running inside workerd, which can only speak HTTP, can read what engines received and
// inject faults.
//
// Control routes:
//   GET  /engines, /stats, /request-stats         every engine's list, stats, figures per x-request-id
//   POST /reset                                   restart stopped engines, clear every engine's state
//   POST /options                                 tunable options for every engine (engine.mjs TUNABLE_OPTIONS)
//   GET  /engines/:id/(stats|requests|request-stats|options)
//   POST /engines/:id/(fault|options|stop|start|reset|metrics-fault)
//
// POST /engines/:id/metrics-fault (test-only, for the router's engine-signal tests) changes what
// the engine's GET /metrics answers; /reset and the engine's reset clear it:
//   { "mode": "none" }                         the model's real series
//   { "mode": "override", "values": { "kvUsage": 0.95, "waiting": 3, "running": 10 } }
//                                              the real series, these values replacing the model's
//   { "mode": "slow", "delayMs": 5000 }        the real series after delayMs (real ms)
//   { "mode": "huge", "bytes": 10000000 }      `bytes` of valid-looking padding series, then the real ones
//   { "mode": "garbage" }                      a 200 whose body is not Prometheus text
//   { "mode": "status", "status": 401 }        that HTTP status with a JSON error
import http from 'node:http';
import { STRING_OPTIONS, TUNABLE_OPTIONS, createRegistry, expectedPrefix, promptDigest, sendJson, startEngine } from './engine.mjs';

export { createRegistry, expectedPrefix, promptDigest, startEngine };

/**
 * @typedef {import('./engine.mjs').Engine} Engine
 * @typedef {Omit<import('./engine.mjs').EngineOptions, 'registry'>} EngineSpec
 * @typedef {object} SimClusterOptions
 * @property {EngineSpec[]} engines
 * @property {number} [controlPort] default 0 (any free port)
 * @property {string} [host] where the control server listens, default 127.0.0.1
 * @property {Partial<EngineSpec>} [defaults] engine options applied to every engine (each engine's own win)
 */

/**
 * @param {SimClusterOptions} options
 * @returns {Promise<{ engines: Map<string, Engine>, registry: import('./engine.mjs').Registry, controlUrl: string, close: () => Promise<void> }>}
 */
export async function startSimCluster({ engines: specs, controlPort = 0, host = '127.0.0.1', defaults = {} }) {
  const registry = createRegistry();
  /** @type {Map<string, Engine>} */
  const engines = new Map();
  try {
    for (const spec of specs) {
      if (engines.has(spec.id)) throw new Error(`duplicate engine id ${spec.id}`);
      engines.set(spec.id, await startEngine({ ...defaults, ...spec, registry }));
    }
  } catch (error) {
    await Promise.all([...engines.values()].map((e) => e.close()));
    throw error;
  }

  const server = http.createServer((req, res) => {
    /** @type {Buffer[]} */
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      control(req.method ?? 'GET', new URL(req.url ?? '/', 'http://control').pathname, Buffer.concat(chunks).toString('utf8'))
        .then(([status, body]) => sendJson(res, status, body))
        .catch((error) => sendJson(res, 500, { error: { message: String(error), type: 'server_error' } }));
    });
  });

  /**
   * @param {string} method @param {string} path @param {string} raw
   * @returns {Promise<[number, unknown]>}
   */
  async function control(method, path, raw) {
    const bad = (/** @type {number} */ status, /** @type {string} */ message) => /** @type {[number, unknown]} */ ([status, { error: { message, type: 'invalid_request_error' } }]);
    if (method === 'GET' && path === '/engines') {
      return [200, [...engines.values()].map((e) => ({ id: e.id, role: e.role, url: e.url, running: e.running }))];
    }
    if (method === 'GET' && path === '/stats') {
      return [200, Object.fromEntries([...engines.values()].map((e) => [e.id, e.stats()]))];
    }
    if (method === 'GET' && path === '/request-stats') {
      // x-request-id -> engine id -> what that engine did for it (the P and D legs side by side)
      /** @type {Record<string, Record<string, unknown>>} */
      const byRequest = {};
      for (const e of engines.values()) {
        for (const [requestId, rec] of Object.entries(e.requestStats())) (byRequest[requestId] ??= {})[e.id] = rec;
      }
      return [200, byRequest];
    }
    if (method === 'POST' && path === '/reset') {
      for (const e of engines.values()) {
        e.reset();
        await e.start();
      }
      registry.rooms.clear();
      registry.prefills.clear();
      registry.claimedRooms.clear();
      registry.handles.clear();
      registry.transfers.clear();
      for (const { fabric } of registry.clocks.values()) fabric.clear();
      return [200, { ok: true }];
    }
    if (method === 'POST' && path === '/options') {
      // tunable engine options for every engine (timeouts, graces, health mode...): see engine.mjs
      const parsed = parseOptions(raw);
      if (typeof parsed === 'string') return bad(400, parsed);
      for (const e of engines.values()) e.setOptions(parsed);
      return [200, { ok: true }];
    }
    const m = /^\/engines\/([^/]+)\/(stats|request-stats|requests|fault|options|stop|start|reset|metrics-fault)$/.exec(path);
    if (!m) return bad(404, `no route ${method} ${path}`);
    const engine = engines.get(decodeURIComponent(m[1]));
    if (!engine) return bad(404, `no engine ${m[1]}`);
    const action = m[2];
    if (method === 'GET' && action === 'stats') return [200, engine.stats()];
    if (method === 'GET' && action === 'requests') return [200, engine.requests()];
    if (method === 'GET' && action === 'request-stats') return [200, engine.requestStats()];
    if (method === 'GET' && action === 'options') return [200, { mooncakeEngineId: engine.mooncakeEngineId, bootstrapPort: engine.bootstrapPort }];
    if (method !== 'POST') return bad(405, `${method} not allowed on ${path}`);
    switch (action) {
      case 'fault': {
        let fault;
        try {
          fault = raw.trim() === '' ? {} : JSON.parse(raw);
        } catch {
          return bad(400, 'fault body is not valid JSON');
        }
        if (!fault || typeof fault !== 'object' || Array.isArray(fault)) return bad(400, 'fault must be an object');
        const modes = ['none', 'status500', 'status400', 'hang', 'reset', 'midstream', 'slow', 'silent', 'eos', 'respond', 'stall', 'flood', 'bigint'];
        if (fault.mode !== undefined && !modes.includes(fault.mode)) return bad(400, `fault.mode must be one of ${modes.join(', ')}`);
        for (const k of ['count', 'delayMs', 'afterChunks']) {
          if (fault[k] !== undefined && !(typeof fault[k] === 'number' && fault[k] >= 0)) return bad(400, `fault.${k} must be a number >= 0`);
        }
        if (fault.health !== undefined && typeof fault.health !== 'boolean') return bad(400, 'fault.health must be a boolean');
        engine.setFault(fault);
        return [200, { ok: true }];
      }
      case 'metrics-fault': {
        let f;
        try {
          f = raw.trim() === '' ? {} : JSON.parse(raw);
        } catch {
          return bad(400, 'metrics fault body is not valid JSON');
        }
        if (!f || typeof f !== 'object' || Array.isArray(f)) return bad(400, 'metrics fault must be an object');
        const modes = ['none', 'override', 'slow', 'huge', 'garbage', 'status'];
        if (f.mode !== undefined && !modes.includes(f.mode)) return bad(400, `metrics fault mode must be one of ${modes.join(', ')}`);
        for (const k of ['delayMs', 'bytes']) {
          if (f[k] !== undefined && !(typeof f[k] === 'number' && f[k] >= 0)) return bad(400, `metrics fault ${k} must be a number >= 0`);
        }
        if (f.status !== undefined && !(Number.isInteger(f.status) && f.status >= 200 && f.status <= 599)) return bad(400, 'metrics fault status must be an HTTP status');
        if (f.values !== undefined) {
          if (!f.values || typeof f.values !== 'object' || Array.isArray(f.values)) return bad(400, 'metrics fault values must be an object');
          for (const [k, v] of Object.entries(f.values)) {
            if (!['kvUsage', 'waiting', 'running'].includes(k)) return bad(400, `metrics fault values.${k}: one of kvUsage, waiting, running`);
            if (!(typeof v === 'number' && v >= 0)) return bad(400, `metrics fault values.${k} must be a number >= 0`);
          }
        }
        engine.setMetricsFault(f);
        return [200, { ok: true }];
      }
      case 'options': {
        const parsed = parseOptions(raw);
        if (typeof parsed === 'string') return bad(400, parsed);
        engine.setOptions(parsed);
        return [200, { ok: true }];
      }
      case 'stop':
        await engine.stop();
        return [200, { ok: true, running: false }];
      case 'start':
        await engine.start();
        return [200, { ok: true, running: true }];
      case 'reset':
        engine.reset();
        return [200, { ok: true }];
      default:
        return bad(405, `${method} not allowed on ${path}`);
    }
  }

  /** @param {string} raw @returns {Record<string, number | boolean | string> | string} */
  function parseOptions(raw) {
    let o;
    try {
      o = raw.trim() === '' ? {} : JSON.parse(raw);
    } catch {
      return 'options body is not valid JSON';
    }
    if (!o || typeof o !== 'object' || Array.isArray(o)) return 'options must be an object';
    for (const [k, v] of Object.entries(o)) {
      if (STRING_OPTIONS[k]) {
        if (!STRING_OPTIONS[k].includes(v)) return `option ${k} must be one of ${STRING_OPTIONS[k].join(', ')}`;
        continue;
      }
      if (!TUNABLE_OPTIONS.includes(k)) return `unknown option ${k}; tunable: ${[...TUNABLE_OPTIONS, ...Object.keys(STRING_OPTIONS)].join(', ')}`;
      if (typeof v !== 'number' && typeof v !== 'boolean') return `option ${k} must be a number or a boolean`;
      if (typeof v === 'number' && !(v >= 0)) return `option ${k} must be >= 0`;
    }
    return o;
  }

  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(controlPort, host, () => resolve(undefined));
  });
  const port = /** @type {import('node:net').AddressInfo} */ (server.address()).port;

  return {
    engines,
    registry,
    controlUrl: `http://${host}:${port}`,
    async close() {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(() => resolve(undefined)));
      await Promise.all([...engines.values()].map((e) => e.close()));
      for (const { clock, holds } of registry.clocks.values()) {
        holds.close();
        clock.close();
      }
    },
  };
}
