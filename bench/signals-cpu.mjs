// The pool object's CPU a second spent on engine signals at 512 nodes, before and after sharded
// polling (issue 24 item 2; docs/scaling.md). workerd's clock does not advance within a call, so
// this measures the same code on V8 in Node: the object's own work per /metrics reading —
//   polling itself:  parse the page (readEngineMetrics) and record it
//   sharded:         copy a poller's push in (structuredClone, what an RPC's argument costs) and
//                    take its readings (newest (at, seq), record)
// times the readings a second (512 nodes every 5 s: 102.4). Fetching is not counted either way.
//   node bench/signals-cpu.mjs
import { build } from 'esbuild';

const entry = `
import { readEngineMetrics } from "./src/state/engine-metrics";
import { EngineSignals } from "./src/state/engine-signals";
import { NodeHealthTable } from "./src/state/health-table";
import { NewestReadings } from "./src/state/poller-shards";
import { SilentNodes } from "./src/state/silent-nodes";
import { vllmMetricsText } from "./test/support/engine-metrics-text";
export { readEngineMetrics, EngineSignals, NodeHealthTable, NewestReadings, SilentNodes, vllmMetricsText };
`;
const out = await build({ stdin: { contents: entry, resolveDir: process.cwd(), loader: 'ts' }, bundle: true, format: 'esm', platform: 'neutral', write: false });
const m = await import(`data:text/javascript;base64,${Buffer.from(out.outputFiles[0].text).toString('base64')}`);

const NODES = 512;
const PER_SECOND = NODES / 5;
const ids = Array.from({ length: NODES }, (_, i) => `n${i}`);
// a small real page (about 20 KB) and a large one (150 KB): vLLM's are 20-150 KB
const page = (kb) => {
  const base = m.vllmMetricsText({ kvUsage: 0.3, waiting: 1, running: 4, capacityTokens: 512_000 });
  let text = base;
  for (let i = 0; text.length < kb * 1024; i++) text += `vllm:request_latency_seconds_bucket{engine="0",le="${i}",model_name="sim-model"} ${i}.0\n`;
  return text;
};

function setup() {
  const health = new m.NodeHealthTable();
  health.sync(new Set(ids));
  return { health, signals: new m.EngineSignals(), silent: new m.SilentNodes(), newest: new m.NewestReadings() };
}
const record = (s, node, reading, at) => {
  const h = s.health.get(node);
  if (!h) return;
  if (reading) s.signals.record(node, reading, at);
  s.silent.polled(node, reading !== null, h.probeUp);
};

function msPerReading(run, n) {
  for (let i = 0; i < Math.min(n, 2_000); i++) run(i); // warm
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < n; i++) run(i);
  return Number(process.hrtime.bigint() - t0) / 1e6 / n;
}

const results = {};
for (const kb of [20, 150]) {
  const text = page(kb);
  const s = setup();
  results[`ownPoll_${kb}KB`] = msPerReading((i) => record(s, ids[i % NODES], m.readEngineMetrics(text), i), 4_000);
}
{
  const s = setup();
  const reading = m.readEngineMetrics(page(20));
  // a poller's push: one sub-tick's slice of its ~128 nodes, ~26 readings
  const push = (k) => ({ version: 'v', poller: 0, readings: ids.slice(0, 26).map((node, j) => ({ node, reading: { ...reading }, at: k, seq: k * 26 + j })) });
  const pushes = Array.from({ length: 400 }, (_, k) => push(k + 1));
  let k = 0;
  const perPush = msPerReading(() => {
    const p = structuredClone(pushes[k++ % pushes.length]);
    for (const r of p.readings) if (s.newest.take(r)) record(s, r.node, r.reading, r.at);
  }, 20_000);
  results.sharded = perPush / 26;
}
const cpu = Object.fromEntries(Object.entries(results).map(([k, ms]) => [k, { msPerReading: +ms.toFixed(4), msPerSecondAt512: +(ms * PER_SECOND).toFixed(2) }]));
console.log(JSON.stringify({ bench: 'signals-cpu', node: process.version, readingsPerSecond: PER_SECOND, cpu }, null, 1));
