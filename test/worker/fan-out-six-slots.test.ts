import { describe, expect, it } from "vitest";
import { SLICE_NODES, slicesFor } from "../../src/config/plan";
import { parseClusterDocument } from "../../src/config/schema";
import { ConnectionSlots } from "../../src/config/connection-slots";
import { listModels } from "../../src/routes/models";
import { periodsOf, pollTimeoutMsOf, slicesOf } from "../../src/state/cluster-settings";
import { pollNodes, probeNodes } from "../../src/state/node-fetch";
import { NodeSlices } from "../../src/state/node-slices";
import type { ClusterView } from "../../src/state/types";
import { vllmMetricsText } from "../support/engine-metrics-text";
import { sixSlotFetch } from "../support/six-slot-fetch";

// Cloudflare lets one invocation have six connections waiting for response headers; a seventh is
// queued until one of them has its headers, with its AbortSignal.timeout already running
// (developers.cloudflare.com/workers/platform/limits/#simultaneous-open-connections). Local
// workerd does not enforce it, so this file puts a six-slot emulator of that rule in front of the
// fan-outs — the alarm's probes and /metrics polls (through a VPC binding, the way a node behind
// one is reached) and GET /v1/models (its `fetch` option) — with every node answering its headers
// 50 ms after it is sent. Sent all at once, 240 nodes need 2 s of slots; with each timeout
// armed when called (1 s here), the tail half timed out although every node was fine.

const HEADERS_MS = 50;
const TIMEOUT_MS = 1_000;
const NODES = 240;

const ids = Array.from({ length: NODES }, (_, i) => `n${i}`);

function bigPool(): ClusterView {
  return {
    version: "six-slots",
    protocol: "colocated",
    policy: {} as ClusterView["policy"],
    health: { intervalMs: 10_000, probeTimeoutMs: TIMEOUT_MS, downAfter: 2, upAfter: 2, ejectAfter: 3, ejectBaseMs: 10_000, ejectMaxMs: 300_000 },
    // a poll's whole read: half the interval, so 1 s
    signals: { intervalMs: 2 * TIMEOUT_MS, staleMs: 10_000, kvBusy: 0.9, queueBusy: 8 },
    nodes: ids.map((id, i) => ({ id, url: `http://10.0.${i >> 8}.${i & 255}:8000`, role: "both", weight: 1, drain: false, localPrefill: true, reach: { binding: "VPC_SIX" } })),
  } as ClusterView;
}

describe("the alarm's probes and polls under the six-connection cap", () => {
  it("240 healthy nodes answering in 50 ms: every probe is up (none falsely down), at most six waiting for headers", async () => {
    const six = sixSlotFetch(() => new Response("ok"), HEADERS_MS);
    const pool = bigPool();
    const up: string[] = [];
    await probeNodes({ VPC_SIX: { fetch: six.fetch } }, pool, pool.nodes, new ConnectionSlots(), (node, ok) => {
      if (ok) up.push(node);
    });
    expect(up.sort()).toEqual([...ids].sort());
    expect(six.maxBusy()).toBeLessThanOrEqual(6);
  });

  it("240 nodes' /metrics: every poll gives a reading (none lost to a timer that ran while queued)", async () => {
    const six = sixSlotFetch(() => new Response(vllmMetricsText({ kvUsage: 0.25, waiting: 1, running: 3 })), HEADERS_MS);
    const pool = bigPool();
    const read: string[] = [];
    await pollNodes({ VPC_SIX: { fetch: six.fetch } }, pollTimeoutMsOf(pool), pool.nodes, new ConnectionSlots(), (node, reading) => {
      if (reading?.kvUsage === 0.25) read.push(node);
    });
    expect(read.sort()).toEqual([...ids].sort());
  });
});

describe("GET /v1/models under the six-connection cap", () => {
  it("240 nodes without a models list: every node's models are listed", async () => {
    const six = sixSlotFetch((url) => Response.json({ data: [{ id: `m-${url.hostname}` }] }), HEADERS_MS);
    const parsed = parseClusterDocument({ protocol: "colocated", nodes: bigPool().nodes.map(({ id, url }) => ({ id, url, role: "both" })) });
    if (!parsed.ok) throw new Error(JSON.stringify(parsed.problems));
    const names = await listModels(parsed.config, { fetch: six.fetch as typeof fetch, timeoutMs: TIMEOUT_MS });
    expect(names).toHaveLength(NODES);
    expect(six.maxBusy()).toBeLessThanOrEqual(6);
  });
});

describe("each job is spread over its period: a slice of the nodes a sub-tick", () => {
  it("a small pool is one slice (one run a period, as before)", () => {
    expect(slicesFor(SLICE_NODES, 10_000)).toBe(1);
    expect(slicesFor(4, 1_000)).toBe(1);
  });

  it("512 nodes polled by the pool's own object: probes every 10 s go out as 10 slices a second apart, polls every 5 s as 5", () => {
    const base = bigPool();
    const pool: ClusterView = {
      ...base,
      // sharding off (it starts above 256 nodes by default): the object's own alarm polls
      signals: { intervalMs: 5_000, staleMs: 15_000, kvBusy: 0.9, queueBusy: 8, shardAbove: 1_000 },
      nodes: Array.from({ length: 512 }, (_, i) => ({ ...base.nodes[0]!, id: `n${i}` })),
    };
    expect(slicesOf(pool)).toEqual({ probe: 10, poll: 5 });
    expect(periodsOf(pool)).toEqual({ probe: 1_000, poll: 1_000 });
    // sharded (the default at 512): poller objects poll, and the poll job only watches them once a period
    const sharded: ClusterView = { ...pool, signals: { ...pool.signals!, shardAbove: undefined } };
    expect(slicesOf(sharded)).toEqual({ probe: 10, poll: 1 });
    expect(periodsOf(sharded)).toEqual({ probe: 1_000, poll: 5_000 });
  });

  it("every node is visited exactly once in each period, whatever the node and slice counts", () => {
    for (const [n, k] of [
      [512, 10],
      [13, 2],
      [100, 7],
      [5, 5],
    ] as const) {
      const nodes = Array.from({ length: n }, (_, i) => i);
      const slices = new NodeSlices();
      for (let period = 0; period < 3; period++) {
        const seen: number[] = [];
        for (let t = 0; t < k; t++) seen.push(...slices.take("probe", nodes, k));
        expect(seen).toEqual(nodes);
      }
    }
  });
});
