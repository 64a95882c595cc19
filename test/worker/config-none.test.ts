import { env, SELF } from "cloudflare:test";
import { describe, expect, it } from "vitest";
import { parseClusterDocument } from "../../src/config/schema";
import { chat, post, putRawCluster } from "./helpers";
import { eventually, seriesValue } from "./ops-helpers";

// Runs before any valid document was seen by the Durable Object of this file's isolate storage.
describe("with no valid cluster document ever seen", () => {
  it("a routed request gets 503 saying what is wrong", async () => {
    await env.NODES.delete("nodes");
    const missing = await post("/v1/chat/completions", chat("x"));
    expect(missing.status).toBe(503);
    expect(((await missing.json()) as any).error.message).toContain('no cluster document in KV binding NODES at key "nodes"');
    await putRawCluster(JSON.stringify({ nodes: [{ id: "bad id!", url: "http://127.0.0.1:1", role: "prefill" }] }));
    const bad = await post("/v1/chat/completions", chat("x"));
    expect(bad.status).toBe(503);
    const e = ((await bad.json()) as any).error;
    expect(e.code).toBe("no_valid_cluster_document");
    expect(e.message).toContain("nodes[0].id");
    // both refusals counted, and the config series say nothing valid serves (/metrics is open here)
    const text = await eventually(async () => {
      const t = await (await SELF.fetch("http://router/metrics")).text();
      expect(seriesValue(t, 'pd_router_requests_total{route="/v1/chat/completions",status="503"}')).toBe(2);
      return t;
    });
    expect(seriesValue(text, "pd_router_config_serving")).toBe(0);
    expect(seriesValue(text, "pd_router_config_valid")).toBe(0);
    expect(seriesValue(text, "pd_router_config_stale")).toBe(0);
    expect(seriesValue(text, "pd_router_config_problems")).toBe(1);
  });
});

describe("cluster document schema", () => {
  const node = { id: "p0", url: "http://10.0.0.1:8100", role: "prefill" };
  const problemsOf = (doc: unknown) => {
    const r = parseClusterDocument({ protocol: "colocated", ...(doc as object) });
    return r.ok ? [] : r.problems.map((p) => p.path);
  };
  const decodeNode = { id: "d0", url: "http://10.0.0.2:8200", role: "decode" };
  it("fills the defaults of SPEC section 2", () => {
    const r = parseClusterDocument({ nodes: [node, decodeNode] });
    expect(r.ok).toBe(true);
    if (!r.ok) return;
    expect(r.config.protocol).toBe("vllm");
    expect(r.config.policy).toMatchObject({ prefill: "affinity", decode: "affinity", pdGroup: "off", pdGroupBonus: 0.3, loadFactor: 1.25, loadSlack: 4 });
    expect(r.config.timeouts).toEqual({ prefillMs: 120000, decodeFirstByteMs: 120000, decodeIdleMs: 120000, nonStreamMs: 3600000 });
    // probeTimeoutMs and probePath default per protocol (probeSettings): 2000 ms and /health for vllm
    expect(r.config.health).toEqual({ intervalMs: 10000, downAfter: 2, upAfter: 2, ejectAfter: 3, ejectBaseMs: 10000, ejectMaxMs: 300000 });
    expect(r.config.nodes[0]).toMatchObject({ weight: 1, bootstrapPort: 8998, drain: false });
  });
  it("names each bad field", () => {
    expect(problemsOf({})).toEqual(["nodes"]);
    expect(problemsOf({ nodes: [{ ...node, url: "http://user:pw@10.0.0.1" }] })).toEqual(["nodes[0].url"]);
    expect(problemsOf({ nodes: [{ ...node, url: "http://10.0.0.1/v1" }] })).toEqual(["nodes[0].url"]);
    expect(problemsOf({ nodes: [{ ...node, url: "http://10.0.0.1?x=1" }] })).toEqual(["nodes[0].url"]);
    expect(problemsOf({ nodes: [{ ...node, url: "file:///etc/passwd" }] })).toEqual(["nodes[0].url"]);
    expect(problemsOf({ nodes: [{ ...node, role: "encode" }] })).toEqual(["nodes[0].role"]);
    expect(problemsOf({ nodes: [{ ...node, weight: 0 }] })).toEqual(["nodes[0].weight"]);
    expect(problemsOf({ nodes: [node, node] })).toEqual(["nodes[1].id"]);
    // reported together with the other problems, not only once the rest is valid
    expect(problemsOf({ nodes: [node, { ...node, role: "encode" }] })).toEqual(["nodes[1].role", "nodes[1].id"]);
    expect(problemsOf({ nodes: [node], timeouts: { prefillMs: 600001 } })).toEqual(["timeouts.prefillMs"]);
    expect(problemsOf({ nodes: [node], health: { intervalMs: 1500.5 } })).toEqual(["health.intervalMs"]);
    expect(problemsOf({ nodes: [node], policy: { prefill: "random" } })).toEqual(["policy.prefill"]);
    expect(problemsOf({ nodes: [node], protocol: "trt" })).toEqual(["protocol"]);
  });
});
