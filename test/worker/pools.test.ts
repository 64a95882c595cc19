import { env, SELF } from "cloudflare:test";
import { beforeEach, describe, expect, it } from "vitest";
import { chat, expectNoLoad, post, putCluster, resetSim } from "./helpers";

// Nodes serving disjoint model sets need no shared state: each pool has its own ClusterState
// object (one object is single-threaded: docs/scaling.md), and operators still see one cluster.
const pool = (name: string) => env.CLUSTER_STATE.get(env.CLUSTER_STATE.idFromName(name));

describe("independent node pools", () => {
  beforeEach(resetSim);

  it("a dry run that is a pool object's first call still lists the pool's nodes", async () => {
    // A model set no other test uses: its pool's object has never seen a document. /v1/route asks
    // the object for its decision and its snapshot at once, and nothing makes the decision (which
    // hands the object the document) land first.
    for (const round of [1, 2, 3]) {
      const model = `first-call-model-${round}`;
      await putCluster({
        protocol: "vllm",
        nodes: [
          { id: "p0", role: "prefill", models: ["sim-model"] },
          { id: "d0", role: "decode", models: ["sim-model"] },
          { id: "c0", role: "both", models: [model] },
          { id: "c1", role: "both", models: [model] },
        ],
      });
      const explained: any = await (await post("/v1/route", chat("x", { model }))).json();
      expect(explained.nodes.map((n: { id: string }) => n.id).sort()).toEqual(["c0", "c1"]);
    }
  });

  it("route each model through its pool's own object, and /metrics shows every node", async () => {
    await putCluster({
      protocol: "vllm",
      policy: { prefill: "round_robin", decode: "round_robin" },
      nodes: [
        { id: "p0", role: "prefill", models: ["sim-model"] },
        { id: "d0", role: "decode", models: ["sim-model"] },
        { id: "pa", role: "prefill", models: ["pool-a-model"] },
        { id: "da", role: "decode", models: ["pool-a-model"] },
      ],
    });
    for (let i = 0; i < 3; i++) {
      const a = await post("/v1/chat/completions", chat(`pool a ${i}`, { model: "pool-a-model" }));
      expect(a.status).toBe(200);
      expect([a.headers.get("x-pd-prefill"), a.headers.get("x-pd-decode")]).toEqual(["pa", "da"]);
      await a.text();
      const s = await post("/v1/chat/completions", chat(`sim ${i}`, { stream: true }));
      expect([s.headers.get("x-pd-prefill"), s.headers.get("x-pd-decode")]).toEqual(["p0", "d0"]);
      await s.text();
    }
    // each object knows only its own nodes and counted only its own requests
    const [a, b] = await Promise.all([pool("pool:pool-a-model").snapshot(), pool("pool:sim-model").snapshot()]);
    expect(a.nodes.map((n) => n.id).sort()).toEqual(["da", "pa"]);
    expect(b.nodes.map((n) => n.id).sort()).toEqual(["d0", "p0"]);
    expect(a.nodes.find((n) => n.id === "da")!.requestsTotal.decode).toBe(3);
    // one view for operators: every node's series, requests summed over the pools
    const metrics = await (await SELF.fetch("http://router/metrics")).text();
    for (const node of ["p0", "d0", "pa", "da"]) expect(metrics).toContain(`pd_router_node_healthy{node="${node}"} 1`);
    expect(metrics).toMatch(/pd_router_node_requests_total\{node="da",role="decode"\} 3/);
    expect(metrics).toMatch(/pd_router_requests_total\{route="\/v1\/chat\/completions",status="200"\} (\d+)/);
    // every lease is released, in the object that took it
    const deadline = Date.now() + 3000;
    let leases = -1;
    while (Date.now() < deadline && leases !== 0) {
      const snaps = await Promise.all([pool("pool:pool-a-model").snapshot(), pool("pool:sim-model").snapshot()]);
      leases = snaps.reduce((n, s) => n + s.leases + s.nodes.reduce((m, x) => m + x.inflight.prefill + x.inflight.decode, 0), 0);
      if (leases !== 0) await new Promise((r) => setTimeout(r, 25));
    }
    expect(leases).toBe(0);
    await expectNoLoad();
  });

  it("a model no pool serves is 404; a dry run explains the pool's own candidates", async () => {
    await putCluster({
      protocol: "vllm",
      nodes: [
        { id: "p0", role: "prefill", models: ["sim-model"] },
        { id: "d0", role: "decode", models: ["sim-model"] },
        { id: "pa", role: "prefill", models: ["pool-a-model"] },
        { id: "da", role: "decode", models: ["pool-a-model"] },
      ],
    });
    expect((await post("/v1/chat/completions", chat("x", { model: "nope" }))).status).toBe(404);
    const explained: any = await (await post("/v1/route", chat("x", { model: "pool-a-model" }))).json();
    expect(explained.candidates.decode.map((c: { id: string }) => c.id)).toEqual(["da"]);
    expect(explained.nodes.map((n: { id: string }) => n.id).sort()).toEqual(["da", "pa"]);
  });
});
