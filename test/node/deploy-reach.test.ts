// Issue 18 items 1 and 2: a router deployed in front of a private cluster. Nodes are named by
// the private addresses the engines themselves use (10.77.0.x, [::1]); the Worker reaches them
// only through a Workers VPC binding (a stand-in that records what passes it, test/node/deploy-rig.ts)
// — so a request that went out over the public internet would never arrive. Nodes behind
// Cloudflare Access get the service token from NODE_* secrets, and only those nodes.
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
// @ts-expect-error plain JS module of the simulator
import { expectedPrefix, startSimCluster } from "../../sim/cluster.mjs";
import { admin, events, startDeployRig, until, type DeployRig, type Passage } from "./deploy-rig";

let cluster: any;
let rig: DeployRig;
const url = (id: string): string => cluster.engines.get(id).url;
const port = (id: string): number => cluster.engines.get(id).port;

const P0 = "http://10.77.0.1:8100";
const D0 = "http://10.77.0.2:8200";
const D1 = "http://10.77.0.3:8200";
/**
 * The same engines at addresses only the Access test's document names: a probe the previous
 * test's document started (its alarm keeps running) can still reach P0 and D0 after it.
 */
const P0_ACCESS = "http://10.77.0.11:8100";
const D0_ACCESS = "http://10.77.0.12:8200";
/** an address the tunnel has no route to: the binding's fetch fails */
const NOWHERE = "http://10.77.0.99:8200";

beforeAll(async () => {
  cluster = await startSimCluster({
    defaults: { timeScale: 0.01 },
    engines: [
      { id: "p0", role: "prefill" },
      { id: "d0", role: "decode" },
      { id: "d1", role: "decode" },
    ],
  });
  rig = await startDeployRig({
    vars: { NODE_ACCESS_ID: "access-id-1", NODE_ACCESS_SECRET: "access-secret-1", NODE_P0_TOKEN: "p0-token" },
    bindings: {
      VPC_GPU: {
        [P0]: url("p0"),
        [D0]: url("d0"),
        [D1]: url("d1"),
        [P0_ACCESS]: url("p0"),
        [D0_ACCESS]: url("d0"),
        // P0's HTTP port over IPv6, and its bootstrap server (the simulator serves /query and the
        // SGLang bootstrap on its HTTP port)
        [`http://[::1]:${port("p0")}`]: url("p0"),
      },
    },
  });
}, 60_000);

afterAll(async () => {
  await rig?.stop();
  await cluster?.close();
});

beforeEach(async () => {
  await fetch(`${cluster.controlUrl}/reset`, { method: "POST" });
  for (const b of Object.values(rig.bindings)) b.passages.length = 0;
});

const rr = { prefill: "round_robin", decode: "round_robin" };
const chat = (content: string, extra: Record<string, unknown> = {}) => ({ model: "sim-model", messages: [{ role: "user", content }], max_tokens: 4, ...extra });
const post = (path: string, body: unknown, headers: Record<string, string> = {}) =>
  rig.fetch(path, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: JSON.stringify(body) });
const passages = () => rig.bindings.VPC_GPU!.passages;
/** Every document probes each second: the object's alarm keeps the interval it was first armed with until it fires. */
const putDocument = (doc: Record<string, unknown>) => rig.putDocument({ health: { intervalMs: 1000 }, ...doc });
const to = (origin: string, what: (p: Passage) => boolean = () => true) => passages().filter((p) => p.url.startsWith(`${origin}/`) && what(p));
const requestsOf = (id: string): Array<{ path: string; headers: Record<string, string>; body: string }> => cluster.engines.get(id).requests();
const answerText = (json: any) => json.choices[0].message?.content ?? json.choices[0].text;

describe("1. nodes reached through a Workers VPC binding: legs, probes, /v1/models and releases all go through it", () => {
  it("a request's P and D legs go to the private addresses through the binding; the answer is this prompt's", async () => {
    await putDocument({
      protocol: "vllm",
      policy: rr,
      reach: { binding: "VPC_GPU" },
      nodes: [
        { id: "p0", url: P0, role: "prefill" },
        { id: "d0", url: D0, role: "decode" },
      ],
    });
    for (const stream of [false, true]) {
      const body = chat(`through the tunnel ${stream}`, { stream });
      const res = await post("/v1/chat/completions", body);
      expect(res.status).toBe(200);
      expect(res.headers.get("x-pd-prefill")).toBe("p0");
      const text = await res.text();
      if (stream) expect(text).toContain(expectedPrefix(body));
      else expect(answerText(JSON.parse(text)).startsWith(expectedPrefix(body))).toBe(true);
    }
    // each leg passed the binding, addressed to the node's private origin, and reached its engine
    expect(to(P0, (p) => p.method === "POST" && p.url.endsWith("/v1/chat/completions"))).toHaveLength(2);
    expect(to(D0, (p) => p.method === "POST" && p.url.endsWith("/v1/chat/completions"))).toHaveLength(2);
    expect(requestsOf("p0").filter((r) => r.path === "/v1/chat/completions")).toHaveLength(2);
    expect(requestsOf("d0").filter((r) => r.path === "/v1/chat/completions")).toHaveLength(2);
  });

  it("the health probes (the Durable Object's alarm) and GET /v1/models go through the binding too", async () => {
    await putDocument({
      protocol: "vllm",
      policy: rr,
      reach: { binding: "VPC_GPU" },
      nodes: [
        { id: "p0", url: P0, role: "prefill" },
        { id: "d0", url: D0, role: "decode" },
      ],
    });
    // the first routed request hands the object the document and arms its alarm
    expect((await post("/v1/chat/completions", chat("arm the probes"))).status).toBe(200);
    await until(
      "both nodes probed through the binding",
      passages,
      () => to(P0, (p) => p.url.endsWith("/health")).length > 0 && to(D0, (p) => p.url.endsWith("/health")).length > 0,
      8000,
    );
    const status = (await (await rig.fetch("/admin/status", { headers: admin })).json()) as any;
    expect(status.nodes.map((n: any) => [n.id, n.probeUp])).toEqual([
      ["p0", true],
      ["d0", true],
    ]);
    const models = (await (await rig.fetch("/v1/models")).json()) as any;
    expect(models.data.map((m: any) => m.id)).toEqual(["sim-model"]);
    expect(to(P0, (p) => p.url.endsWith("/v1/models")).length).toBe(1);
  });

  it("a D the tunnel cannot reach: failover to the next D, and P's unread handle is released through the binding", async () => {
    await putDocument({
      protocol: "vllm",
      policy: rr,
      reach: { binding: "VPC_GPU" },
      nodes: [
        { id: "p0", url: P0, role: "prefill" },
        { id: "dx", url: NOWHERE, role: "decode" },
        { id: "d1", url: D1, role: "decode" },
      ],
    });
    for (const content of ["unreachable one", "unreachable two"]) {
      const body = chat(content);
      const res = await post("/v1/chat/completions", body);
      expect(res.status).toBe(200);
      expect(res.headers.get("x-pd-decode")).toBe("d1");
      expect(answerText(await res.json()).startsWith(expectedPrefix(body))).toBe(true);
    }
    expect(to(NOWHERE).length).toBeGreaterThanOrEqual(1);
    const p0 = await until(
      "p0 holds no handle",
      () => cluster.engines.get("p0").stats(),
      (s: any) => s.heldHandles === 0,
    );
    expect(p0.releasedHandles).toBeGreaterThanOrEqual(1);
    const releases = to(D1, (p) => p.url.endsWith("/v1/completions"));
    expect(releases.length).toBe(p0.releasedHandles);
  });
});

describe("1. Cloudflare Access: the service token from NODE_* secrets, on every request to a node that names it, and only there", () => {
  it("P (behind Access) gets CF-Access-Client-Id/Secret on its leg and its probes; D (no Access) never does, nor any client-sent copy", async () => {
    await putDocument({
      protocol: "vllm",
      policy: rr,
      nodes: [
        {
          id: "p0",
          url: P0_ACCESS,
          role: "prefill",
          apiKeySecret: "NODE_P0_TOKEN",
          reach: { binding: "VPC_GPU", access: { clientId: "NODE_ACCESS_ID", clientSecret: "NODE_ACCESS_SECRET" } },
        },
        { id: "d0", url: D0_ACCESS, role: "decode", reach: { binding: "VPC_GPU" } },
      ],
    });
    const res = await post("/v1/chat/completions", chat("behind access"), { "cf-access-client-id": "client-sent", "cf-access-client-secret": "client-sent" });
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    await until("p0 probed", passages, () => to(P0_ACCESS, (p) => p.url.endsWith("/health")).length > 0 && to(D0_ACCESS, (p) => p.url.endsWith("/health")).length > 0, 8000);
    const atP = to(P0_ACCESS);
    expect(atP.some((p) => p.method === "POST")).toBe(true);
    for (const p of atP) {
      expect(p.headers["cf-access-client-id"]).toBe("access-id-1");
      expect(p.headers["cf-access-client-secret"]).toBe("access-secret-1");
      expect(p.headers.authorization).toBe("Bearer p0-token");
    }
    const atD = to(D0_ACCESS);
    expect(atD.length).toBeGreaterThanOrEqual(2);
    for (const p of atD) {
      expect(p.headers).not.toHaveProperty("cf-access-client-id");
      expect(p.headers).not.toHaveProperty("cf-access-client-secret");
      expect(p.headers).not.toHaveProperty("authorization");
    }
  });

  it("an engine or proxy that echoes the credentials it was sent: the client and the log line see neither the Access id and secret nor the bearer token (issue 25 item 4)", async () => {
    // an auth proxy in front of the engine that quotes the headers it rejected, as a 400 JSON error
    cluster.engines.get("d0").setFault({
      mode: "respond",
      count: 1,
      status: 400,
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ error: { message: "bad request: CF-Access-Client-Id access-id-1, CF-Access-Client-Secret access-secret-1, Authorization Bearer p0-token" } }),
    });
    await putDocument({
      protocol: "colocated",
      nodes: [
        {
          id: "c",
          url: D0,
          role: "both",
          apiKeySecret: "NODE_P0_TOKEN",
          reach: { binding: "VPC_GPU", access: { clientId: "NODE_ACCESS_ID", clientSecret: "NODE_ACCESS_SECRET" } },
        },
      ],
    });
    const id = `echoed-secrets-${Date.now()}`;
    const res = await post("/v1/chat/completions", chat("echo my credentials"), { "x-request-id": id });
    expect(res.status).toBe(400);
    const message = ((await res.json()) as any).error.message as string;
    expect(message).toContain("bad request");
    expect(message).toContain("[redacted]");
    const line = await until(
      "the request's log line",
      async () => events(rig, "request").filter((e) => e.requestId === id),
      (l) => l.length === 1,
      5000,
    );
    for (const text of [message, JSON.stringify(line)]) for (const secret of ["access-id-1", "access-secret-1", "p0-token"]) expect(text).not.toContain(secret);
  });

  it("a binding the Worker does not have, or an Access secret that is not set: the node fails naming it, and nothing is sent without them", async () => {
    await putDocument({ protocol: "colocated", nodes: [{ id: "c", url: D0, role: "both", reach: { binding: "VPC_MISSING" } }] });
    let res = await post("/v1/chat/completions", chat("no such binding"));
    expect(res.status).toBe(502);
    expect(((await res.json()) as any).error.message).toContain("VPC_MISSING");

    await putDocument({
      protocol: "colocated",
      nodes: [{ id: "c", url: D0, role: "both", reach: { binding: "VPC_GPU", access: { clientId: "NODE_ACCESS_ID", clientSecret: "NODE_UNSET_SECRET" } } }],
    });
    res = await post("/v1/chat/completions", chat("no such secret"));
    expect(res.status).toBe(502);
    expect(((await res.json()) as any).error.message).toContain("NODE_UNSET_SECRET");
    // (the previous test's document probes its own addresses until the object hears of this one)
    expect(to(D0)).toHaveLength(0);
  });

  it("a document may name only VPC_* bindings and NODE_* secrets: never the router's own KV, Durable Object or secrets", async () => {
    const put = async (reach: unknown) => {
      const res = await rig.fetch("/admin/nodes", {
        method: "PUT",
        headers: { ...admin, "content-type": "application/json" },
        body: JSON.stringify({ protocol: "colocated", nodes: [{ id: "c", url: D0, role: "both", reach }] }),
      });
      return { status: res.status, body: (await res.json()) as any };
    };
    for (const binding of ["NODES", "CLUSTER_STATE", "RATE_LIMITER"]) {
      const { status, body } = await put({ binding });
      expect(status).toBe(400);
      expect(body.error.problems.map((p: any) => p.path)).toEqual(["nodes[0].reach.binding"]);
    }
    const { status, body } = await put({ access: { clientId: "ADMIN_TOKEN", clientSecret: "API_KEYS" } });
    expect(status).toBe(400);
    expect(body.error.problems.map((p: any) => p.path).sort()).toEqual(["nodes[0].reach.access.clientId", "nodes[0].reach.access.clientSecret"]);
    expect((await put({ binding: "VPC_GPU", access: { clientId: "NODE_ACCESS_ID", clientSecret: "NODE_ACCESS_SECRET" } })).status).toBe(200);
  });
});

describe("2. bootstrap addresses: the address decode nodes use, IPv6 in brackets", () => {
  const sglangBodies = (id: string) =>
    requestsOf(id)
      .filter((r) => r.path === "/v1/chat/completions")
      .map((r) => r.body);

  it("sglang: a node reached at a private IPv6 address sends bootstrap_host in brackets (SGLang builds http://{host}:{port}/route from it)", async () => {
    await putDocument({
      protocol: "sglang",
      policy: rr,
      reach: { binding: "VPC_GPU" },
      nodes: [
        { id: "p0", url: `http://[::1]:${port("p0")}`, role: "prefill", bootstrapPort: port("p0") },
        { id: "d0", url: D0, role: "decode" },
      ],
    });
    const body = chat("sglang over ipv6");
    const res = await post("/v1/chat/completions", body);
    expect(res.status).toBe(200);
    expect(answerText(await res.json()).startsWith(expectedPrefix(body))).toBe(true);
    for (const raw of [...sglangBodies("p0"), ...sglangBodies("d0")]) {
      expect(raw).toContain('"bootstrap_host":"[::1]"');
      expect(JSON.parse(raw).bootstrap_port).toBe(port("p0"));
    }
  });

  it("sglang: bootstrapHost overrides the URL's host (the Worker reaches P at one address, D at another); a bare IPv6 literal is bracketed", async () => {
    for (const [bootstrapHost, sent] of [
      ["127.0.0.1", "127.0.0.1"],
      ["::1", "[::1]"],
    ]) {
      await fetch(`${cluster.controlUrl}/reset`, { method: "POST" });
      await putDocument({
        protocol: "sglang",
        policy: rr,
        reach: { binding: "VPC_GPU" },
        nodes: [
          { id: "p0", url: P0, role: "prefill", bootstrapPort: port("p0"), bootstrapHost },
          { id: "d0", url: D0, role: "decode" },
        ],
      });
      const body = chat(`sglang bootstrap host ${bootstrapHost}`);
      const res = await post("/v1/chat/completions", body);
      expect(res.status).toBe(200);
      expect(answerText(await res.json()).startsWith(expectedPrefix(body))).toBe(true);
      const [p] = sglangBodies("p0");
      const [d] = sglangBodies("d0");
      expect(p).toContain(`"bootstrap_host":${JSON.stringify(sent)}`);
      expect(d).toBe(p);
    }
  });

  it("vllm-mooncake: remote_bootstrap_addr uses bootstrapHost (IPv6 in brackets), and the router's /query reaches it through the binding", async () => {
    await putDocument({
      protocol: "vllm-mooncake",
      policy: rr,
      reach: { binding: "VPC_GPU" },
      nodes: [
        { id: "p0", url: P0, role: "prefill", bootstrapPort: port("p0"), bootstrapHost: "::1" },
        { id: "d0", url: D0, role: "decode" },
      ],
    });
    const body = chat("mooncake over ipv6");
    const res = await post("/v1/chat/completions", body);
    expect(res.status).toBe(200);
    expect(answerText(await res.json()).startsWith(expectedPrefix(body))).toBe(true);
    const d = requestsOf("d0").find((r) => r.path === "/v1/chat/completions")!;
    expect(JSON.parse(d.body).kv_transfer_params.remote_bootstrap_addr).toBe(`http://[::1]:${port("p0")}`);
    expect(to(`http://[::1]:${port("p0")}`, (p) => p.url.endsWith("/query"))).toHaveLength(1);
    expect(cluster.engines.get("d0").stats().protocolViolations).toBe(0);
  });
});

describe("the log never carries a node's secrets", () => {
  it("no line of the router's output holds the Access secret or a node token", () => {
    expect(rig.lines().some((l) => l.includes("access-secret-1") || l.includes("p0-token"))).toBe(false);
    expect(events(rig, "request").length).toBeGreaterThan(0);
  });
});
