// A short CPU profile of the router under load, from workerd's V8 inspector (Chrome DevTools
// protocol: Profiler.start / Profiler.stop over the isolate's websocket). The Worker and its
// Durable Object share one isolate here, so one profile covers both. Prints the top self-time
// entries and writes the .cpuprofile (open it in Chrome DevTools > Performance).
//
//   node bench/profile.mjs [--policy round_robin] [--concurrency 16] [--seconds 10] [--top 15]
//                          [--src HEAD] [--out bench/out/profile.cpuprofile] [--interval-us 100]
//                          [--output-tokens 8] [--no-usage]   (streams of that many tokens; without a usage frame asked)
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { numberOption, parseArgs, stringOption } from './lib/args.mjs';
import { bundleModules, formatTop, topSelfTime } from './lib/cpu-profile.mjs';
import { onShutdown, policyFor, startSimCluster, workerSnapshot } from './lib/harness.mjs';
import { createAgent, postJson, runPool } from './lib/http-client.mjs';
import { cpuMeter } from './lib/proc.mjs';
import { startWorkerd } from './lib/workerd.mjs';
import { devtools } from '../scripts/devtools.mjs';

const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const { options } = parseArgs(['profile', ...process.argv.slice(2)]);
const policy = stringOption(options, 'policy', 'round_robin');
const concurrency = numberOption(options, 'concurrency', 16);
const seconds = numberOption(options, 'seconds', 10);
const top = numberOption(options, 'top', 15);
const intervalUs = numberOption(options, 'interval-us', 100);
const outputTokens = numberOption(options, 'output-tokens', 8);
const usage = !options['no-usage'];
const out = path.resolve(stringOption(options, 'out', path.join(REPO_ROOT, 'bench', 'out', 'profile.cpuprofile')));
const src = stringOption(options, 'src');
if (src) process.env.BENCH_SRC = src;

const cluster = await startSimCluster({
  engines: [
    { id: 'p0', role: 'prefill' },
    { id: 'p1', role: 'prefill' },
    { id: 'd0', role: 'decode' },
    { id: 'd1', role: 'decode' },
  ],
  defaults: { timeScale: 0 },
});
const persistDir = mkdtempSync(path.join(os.tmpdir(), 'pd-bench-profile-'));
const router = await startWorkerd({
  cwd: workerSnapshot(),
  persistDir,
  inspectorPort: 0,
  clusterDocument: { protocol: 'vllm', policy: policyFor(policy), nodes: [...cluster.engines.values()].map((e) => ({ id: e.id, url: e.url, role: e.role })) },
});
const stop = async () => {
  await router.stop();
  await cluster.close();
  rmSync(persistDir, { recursive: true, force: true });
};
onShutdown(stop);
let status = 0;
try {
  const agent = createAgent(concurrency * 2);
  const body = (/** @type {number} */ i) => ({
    model: 'sim-model',
    messages: [{ role: 'user', content: `request ${i} `.padEnd(64, 'x') }],
    stream: true,
    ...(usage ? { stream_options: { include_usage: true } } : {}),
    max_tokens: outputTokens,
  });
  let seq = 0;
  let failed = 0;
  const load = async (/** @type {number} */ ms) => {
    const until = performance.now() + ms;
    await runPool(concurrency, concurrency, async () => {
      while (performance.now() < until) {
        const r = await postJson(`${router.url}/v1/chat/completions`, body(seq++), { agent });
        if (r.status !== 200 || r.error) failed++;
      }
    });
  };
  await load(2000); // warm: JIT, connections, the Durable Object
  const targets = /** @type {{ webSocketDebuggerUrl: string, title?: string, id: string }[]} */ (await (await fetch(`http://127.0.0.1:${router.inspectorPort}/json/list`)).json());
  if (!targets.length) throw new Error('workerd lists no inspector target');
  const target = targets[0];
  const session = await devtools(target.webSocketDebuggerUrl.replace('localhost', '127.0.0.1'));
  await session.send('Profiler.enable');
  await session.send('Profiler.setSamplingInterval', { interval: intervalUs });
  const requestsBefore = seq;
  failed = 0;
  const cpu = cpuMeter(router.pid);
  await session.send('Profiler.start');
  await load(seconds * 1000);
  const { profile } = await session.send('Profiler.stop');
  const cpuMs = cpu.stop();
  session.close();
  mkdirSync(path.dirname(out), { recursive: true });
  writeFileSync(out, JSON.stringify(profile));
  const requests = seq - requestsBefore;
  const head = [
    `router CPU profile: policy ${policy}, concurrency ${concurrency}, ${outputTokens}-token streams${usage ? '' : ' without usage'}, ${seconds} s, ${requests} requests (${failed} failed), ${(requests / seconds).toFixed(0)} requests/s`,
    `workerd CPU ${(cpuMs / requests).toFixed(2)} ms a request (whole process, profiler on); sampling every ${intervalUs} us; inspector target: ${target.title ?? target.id}`,
    `Worker: ${JSON.stringify((await import('./lib/harness.mjs')).workerSource())}; load average ${os
      .loadavg()
      .map((x) => x.toFixed(2))
      .join(' ')}`,
  ];
  const sourceOf = bundleModules(readFileSync(path.join(persistDir, 'bundle', 'worker.mjs'), 'utf8'));
  console.log(`${head.join('\n')}\n\n${formatTop(topSelfTime(profile, top, sourceOf))}\n\nprofile: ${out}`);
} catch (error) {
  console.error(error instanceof Error ? error.stack : error);
  status = 1;
} finally {
  await stop();
}
process.exit(status);
