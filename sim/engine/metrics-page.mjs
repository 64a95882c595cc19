// GET /metrics of a simulated engine: the real engines' Prometheus series with the engine model's
// values (sim/model/metrics.mjs), through the test-only metrics fault (sim/cluster.mjs documents it).
import { setTimeout as sleepReal } from 'node:timers/promises';
import { hugeMetrics, renderMetrics } from '../model/metrics.mjs';
import { drained, sendError } from '../wire.mjs';

/** @typedef {import('./state.mjs').EngineState} EngineState */

/**
 * The /metrics body as the engine's model has it now; `override` values replace the model's.
 * @param {EngineState} state @param {{ kvUsage?: number, waiting?: number, running?: number }} [values]
 */
export function metricsBody(state, values = {}) {
  const { core, memory, models } = state;
  const counts = core.counts();
  return renderMetrics(
    {
      kind: /** @type {'vllm' | 'sglang'} */ (state.kind),
      vllmMetrics: /** @type {'v1' | 'v0'} */ (state.vllmMetrics),
      sglangPrefix: /** @type {'sglang:' | 'sglang_'} */ (state.sglangMetricsPrefix),
    },
    {
      modelName: models[0],
      kvUsage: values.kvUsage ?? memory.usage(),
      waiting: values.waiting ?? counts.waiting,
      running: values.running ?? counts.running,
      blockSize: memory.blockSize,
      numGpuBlocks: memory.numBlocks,
      gpuMemoryUtilization: state.figures.gpuMemoryUtilization,
      promptTokens: state.stats.promptTokens,
      generationTokens: state.stats.outputTokens,
      preemptions: core.stats.preemptions,
      prefixQueries: state.stats.promptTokens,
      prefixHits: state.stats.cachedTokens,
    },
  );
}

/**
 * GET /metrics, through the test-only metrics fault (sim/cluster.mjs documents it).
 * @param {EngineState} state @param {import('node:http').ServerResponse} res
 */
export async function serveMetrics(state, res) {
  const f = state.metricsFault;
  const send = (/** @type {string} */ body) => {
    if (res.destroyed) return;
    res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4; charset=utf-8', 'content-length': Buffer.byteLength(body) });
    res.end(body);
  };
  switch (f.mode) {
    case 'status':
      return sendError(res, f.status, `simulated /metrics status ${f.status}`, 'server_error');
    case 'slow':
      await sleepReal(f.delayMs);
      return send(metricsBody(state));
    case 'garbage':
      res.writeHead(200, { 'content-type': 'text/html' });
      return res.end('<html><body>502 Bad Gateway</body></html>\n{"not": "prometheus"}\nvllm:kv_cache_usage_perc{engine="0" NaNa\n');
    case 'huge': {
      res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4; charset=utf-8' });
      for (const chunk of hugeMetrics(metricsBody(state), f.bytes)) {
        if (res.destroyed) return;
        if (!res.write(chunk)) await drained(res);
      }
      return res.end();
    }
    case 'override':
      return send(metricsBody(state, f.values));
    default:
      return send(metricsBody(state));
  }
}
