import { env, runDurableObjectAlarm } from "cloudflare:test";
import { describe, expect, it } from "vitest";
import { chatBody, frontStats, kv, nodeUrl, post, resetState, setMetrics, snapshot, stub, useSignalsRig } from "./signals-helpers";

useSignalsRig();

// The object's alarm spreads each job over its period (issue 24, item 1): a pool of more than 12
// nodes is polled a slice a run (src/config/plan.ts slicesFor, src/state/node-slices.ts), not
// every node at once. 24 nodes, all fronted by one /metrics server: 2 slices of 12.

describe("the alarm polls a slice of the nodes a run", () => {
  it("24 nodes: 12 polls a run, and every node has a reading after two runs", async () => {
    await resetState();
    await setMetrics("d0", kv(0.3));
    const ids = Array.from({ length: 24 }, (_, i) => `n${i}`);
    await env.NODES.put(
      "nodes",
      JSON.stringify({
        protocol: "colocated",
        policy: { prefill: "round_robin", decode: "round_robin" },
        health: { intervalMs: 600_000 },
        signals: { intervalMs: 600_000, staleMs: 1_200_000 },
        nodes: ids.map((id) => ({ id, url: nodeUrl("d0"), role: "both" })),
      }),
    );
    // a dry run hands the document to the object
    await (await post("/v1/route", chatBody("slices"))).arrayBuffer();
    const before = (await frontStats("d0")).metricsRequests;
    await runDurableObjectAlarm(stub() as never);
    expect((await frontStats("d0")).metricsRequests - before).toBe(12);
    expect((await snapshot()).nodes.filter((n) => n.signals !== null)).toHaveLength(12);
    await runDurableObjectAlarm(stub() as never);
    expect((await frontStats("d0")).metricsRequests - before).toBe(24);
    expect((await snapshot()).nodes.filter((n) => n.signals?.kvUsage === 0.3)).toHaveLength(24);
  });
});
