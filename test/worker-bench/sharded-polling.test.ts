import { env, runInDurableObject, SELF } from "cloudflare:test";
import { describe, expect, it } from "vitest";
import { pollerCount } from "../../src/config/plan";
import { pollerName } from "../../src/state/poller-shards";
import { vllmMetricsText } from "../support/engine-metrics-text";
import { type SixSlotFetch, sixSlotFetch } from "../support/six-slot-fetch";

// Measurement of sharded polling (issue 24 item 2; docs/scaling.md): 512 nodes, every one answering
// its headers 50 ms after it is sent, behind a six-slot emulator of Cloudflare's per-invocation
// connection rule installed in the pool's object and in each poller object (each object its own six
// slots: at most what an invocation of it gets). Default settings: probes every 10 s, polls every
// 5 s, stale after 15 s, sharded above 256 nodes, 128 a poller. Run only on purpose:
//   PD_BENCH_SHARDED_S=600 npx vitest run --project worker-bench
// (PD_BENCH_SHARD_ABOVE=100000: the same 512 nodes polled by the pool's own object, for comparison;
// PD_BENCH_HEADERS_MS=150: every node slower to answer)
// Prints one JSON line: nodes falsely down (probe down or not healthy, although every node
// answers), signal age percentiles against the interval, polls and probes timed out.

const NODES = 512;

const benchEnv = env as unknown as { BENCH_SECONDS?: string; BENCH_SHARD_ABOVE?: string; BENCH_HEADERS_MS?: string };
const SECONDS = Number(benchEnv.BENCH_SECONDS ?? "60");
// BENCH_HEADERS_MS: a slower tunnel or engine
const HEADERS_MS = Number(benchEnv.BENCH_HEADERS_MS ?? "50");
// a page of about 20 KB, the small end of a real vLLM's (the pollers parse it; the pool never does)
const PAGE = `${vllmMetricsText({ kvUsage: 0.3, waiting: 0, running: 4, capacityTokens: 512_000 })}${"# padding to a real page's size\n".repeat(600)}`;

const run = runInDurableObject as unknown as <T>(stub: unknown, cb: (instance: any, state: DurableObjectState) => T | Promise<T>) => Promise<T>;
const pool = () => env.CLUSTER_STATE.get(env.CLUSTER_STATE.idFromName("cluster"));
const poller = (i: number) => env.SIGNAL_POLLER.get(env.SIGNAL_POLLER.idFromName(pollerName(pool().id.toString(), i)));
const percentile = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] ?? null;
};

describe("sharded polling at 512 nodes under the six-connection rule", () => {
  it(`runs ${SECONDS} s: no node falsely down, signal age p99 within twice the interval`, { timeout: (SECONDS + 120) * 1000 }, async () => {
    const pollers = pollerCount(NODES, { shardAbove: Number(benchEnv.BENCH_SHARD_ABOVE ?? 256) });
    // each object its own emulator, installed before the document reaches it
    const objects = [pool(), ...Array.from({ length: pollers }, (_, i) => poller(i))];
    const envs = new Set<unknown>();
    for (const o of objects)
      await run(o, (instance) => {
        const six = sixSlotFetch((url) => new Response(url.pathname === "/metrics" ? PAGE : "ok"), HEADERS_MS);
        // the objects share one env: each gets its own, over it, holding its own emulator
        instance.env = Object.assign(Object.create(instance.env), { VPC_SIX: six });
        envs.add(instance.env);
        (globalThis as any).__six ??= [];
        (globalThis as any).__six.push(six.stats);
      });
    // each object its own six slots
    expect(envs.size).toBe(objects.length);
    // what reaches the pool's object: pushes, readings, their bytes as JSON (its only signals work while sharded)
    const pushes = { calls: 0, readings: 0, jsonBytes: 0 };
    await run(pool(), (instance) => {
      // RPC calls the class's method: wrapped on the prototype (this bench's workerd only)
      const proto = Object.getPrototypeOf(instance);
      const push = proto.pushReadings;
      proto.pushReadings = function (this: unknown, p: { readings: unknown[] }) {
        pushes.calls++;
        pushes.readings += p.readings.length;
        pushes.jsonBytes += JSON.stringify(p).length;
        return push.call(this, p);
      };
    });
    const doc = {
      protocol: "colocated",
      policy: { prefill: "round_robin", decode: "round_robin" },
      // BENCH_SHARD_ABOVE=100000: the pool's own object polls every node (the comparison)
      signals: { shardAbove: Number(benchEnv.BENCH_SHARD_ABOVE ?? 256) },
      nodes: Array.from({ length: NODES }, (_, i) => ({ id: `n${i}`, url: `http://10.0.${i >> 8}.${i & 255}:8000`, role: "both", reach: { binding: "VPC_SIX" } })),
    };
    await env.NODES.put("nodes", JSON.stringify(doc));
    const res = await SELF.fetch("http://router/v1/route", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "x" }] }),
    });
    await res.arrayBuffer();

    const intervalMs = 5_000;
    const warmupMs = 2 * intervalMs;
    const start = Date.now();
    const ages: number[] = [];
    let falselyDown = new Set<string>();
    let maxDownAtOnce = 0;
    let samples = 0;
    let missingAfterWarmup = 0;
    while (Date.now() - start < SECONDS * 1000) {
      await new Promise((r) => setTimeout(r, 1_000));
      const snap = await pool().snapshot();
      const down = snap.nodes.filter((n) => !n.probeUp || !n.healthy).map((n) => n.id);
      falselyDown = new Set([...falselyDown, ...down]);
      maxDownAtOnce = Math.max(maxDownAtOnce, down.length);
      if (Date.now() - start < warmupMs) continue;
      samples++;
      for (const n of snap.nodes) {
        if (n.signals) ages.push(n.signals.ageMs);
        else missingAfterWarmup++;
      }
    }
    const stats = (globalThis as any).__six as SixSlotFetch["stats"][];
    const result = {
      bench: "sharded-polling",
      seconds: SECONDS,
      nodes: NODES,
      pollers,
      headersMs: HEADERS_MS,
      intervalMs,
      snapshots: samples,
      nodesFalselyDown: falselyDown.size,
      maxDownAtOnce,
      readingsMissingAfterWarmup: missingAfterWarmup,
      ageMs: { p50: percentile(ages, 50), p99: percentile(ages, 99), max: percentile(ages, 100) },
      pushesPerSecond: pushes.calls / SECONDS,
      readingsPerSecond: pushes.readings / SECONDS,
      pushBytesPerSecond: Math.round(pushes.jsonBytes / SECONDS),
      fetches: stats.map((s, i) => ({ object: i === 0 ? "pool" : `poller:${i - 1}`, ...s })),
    };
    console.log(`BENCH ${JSON.stringify(result)}`);
    expect(falselyDown.size).toBe(0);
    expect(result.ageMs.p99!).toBeLessThanOrEqual(2 * intervalMs);
  });
});
