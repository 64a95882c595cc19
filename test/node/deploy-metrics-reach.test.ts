// Issue 18 item 1, the /metrics poll: nodes on private addresses are reached only through a Workers
// VPC binding (a stand-in that records what passes it, test/node/deploy-rig.ts), and "every leg,
// probe and /metrics poll goes the same way". deploy-reach.test.ts proves it for the legs, the
// probes and /v1/models; here the pool's Durable Object polls every node's GET /metrics from its
// alarm every `signals.intervalMs` (src/state/node-fetch.ts `pollEngineMetrics`), and the poll must
// pass the binding, to the node's private address, with the node's bearer and Access service
// token — and its reading must come back (a poll sent any other way would never arrive: the
// private addresses exist only behind the binding).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
// @ts-expect-error plain JS module of the simulator
import { startSimCluster } from "../../sim/cluster.mjs";
import { startMetricsFront, type MetricsFront } from "../support/metrics-front";
import { admin, startDeployRig, until, type DeployRig } from "./deploy-rig";

const P0 = "http://10.77.1.1:8100";
const D0 = "http://10.77.1.2:8200";

let cluster: any;
let rig: DeployRig;
const fronts: Record<string, MetricsFront> = {};

beforeAll(async () => {
  cluster = await startSimCluster({
    defaults: { timeScale: 0.01 },
    engines: [
      { id: "p0", role: "prefill" },
      { id: "d0", role: "decode" },
    ],
  });
  // each engine behind a front that answers /metrics with a vLLM page of known figures
  for (const id of ["p0", "d0"]) fronts[id] = await startMetricsFront(cluster.engines.get(id).url);
  fronts.p0!.set({ mode: "override", values: { kvUsage: 0.17, waiting: 0, running: 1 } });
  fronts.d0!.set({ mode: "override", values: { kvUsage: 0.42, waiting: 3, running: 5 } });
  rig = await startDeployRig({
    vars: { NODE_ACCESS_ID: "access-id-m", NODE_ACCESS_SECRET: "access-secret-m", NODE_D0_TOKEN: "d0-token" },
    bindings: { VPC_GPU: { [P0]: fronts.p0!.url, [D0]: fronts.d0!.url } },
  });
  await rig.putDocument({
    protocol: "vllm",
    policy: { prefill: "round_robin", decode: "round_robin" },
    reach: { binding: "VPC_GPU" },
    health: { intervalMs: 1000 },
    signals: { intervalMs: 1000, staleMs: 60_000 },
    nodes: [
      { id: "p0", url: P0, role: "prefill" },
      {
        id: "d0",
        url: D0,
        role: "decode",
        apiKeySecret: "NODE_D0_TOKEN",
        reach: { binding: "VPC_GPU", access: { clientId: "NODE_ACCESS_ID", clientSecret: "NODE_ACCESS_SECRET" } },
      },
    ],
  });
}, 60_000);

afterAll(async () => {
  await rig?.stop();
  await Promise.all(Object.values(fronts).map((f) => f.close()));
  await cluster?.close();
});

const polls = (origin: string) => rig.bindings.VPC_GPU!.passages.filter((p) => p.method === "GET" && p.url === `${origin}/metrics`);

describe("1. the /metrics poll goes through the node's VPC binding, with the node's headers, like every request to it", () => {
  it("the object's alarm polls each node's private /metrics through the binding, and routing reads what the engines reported", async () => {
    // the first routed request hands the object the document and arms its alarm
    const res = await rig.fetch("/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "sim-model", messages: [{ role: "user", content: "arm the polls" }], max_tokens: 2 }),
    });
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    await until(
      "both nodes' /metrics polled through the binding",
      () => polls(P0).length > 0 && polls(D0).length > 0,
      (ok) => ok,
      10_000,
    );
    // they arrived: the fronts answered them (only the binding knows the way to them); the binding
    // records a passage as it forwards it, so the front may count it a moment later
    await until(
      "the fronts answered the polls",
      async () => fronts.p0!.stats().metricsRequests > 0 && fronts.d0!.stats().metricsRequests > 0,
      (ok) => ok,
      10_000,
    );
    // d0's poll carries its bearer and its Access service token; p0's carries neither
    for (const p of polls(D0)) {
      expect(p.headers.authorization).toBe("Bearer d0-token");
      expect(p.headers["cf-access-client-id"]).toBe("access-id-m");
      expect(p.headers["cf-access-client-secret"]).toBe("access-secret-m");
    }
    for (const p of polls(P0)) {
      expect(p.headers).not.toHaveProperty("authorization");
      expect(p.headers).not.toHaveProperty("cf-access-client-id");
    }
    // the reading came back through the binding: the router reports the engines' own figures
    const metrics = await until(
      "the engines' readings in /metrics",
      async () => (await rig.fetch("/metrics")).text(),
      (t) => /pd_router_node_kv_usage\{node="d0"\} 0\.42\b/.test(t) && /pd_router_node_kv_usage\{node="p0"\} 0\.17\b/.test(t),
      10_000,
    );
    expect(metrics).toMatch(/pd_router_node_queue\{node="d0"\} 3\b/);
    const status = (await (await rig.fetch("/admin/status", { headers: admin })).json()) as any;
    expect(status.nodes.map((n: any) => n.id)).toEqual(["p0", "d0"]);
  });
});
