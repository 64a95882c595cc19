// Issue 11, items 5, 6/11 (the loop), 7, 9 and 10, over real TCP against the Worker in workerd:
// nodes that answer what a node should never answer (a wrong token's 401, redirects, 304, 204),
// a node URL that points back at the router, integers beyond 2^53, percent-encoded paths.
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { chatBody, expectEnginesIdle, expectReleased, request, sleep, startRig, until, type Rig } from "./lifecycle-harness";
import { seededRandom } from "../support/seeded";

const random = seededRandom(144);

const NODE_TOKEN = "node-secret-that-must-not-leak-7f3a";
const BIG = "12345678901234567890";

let rig: Rig;
let self = "";
const document = (url: (id: string) => string) => ({
  protocol: "vllm",
  policy: { prefill: "affinity", decode: "affinity" },
  timeouts: { prefillMs: 3000, decodeFirstByteMs: 3000, decodeIdleMs: 2000, nonStreamMs: 3000 },
  // ejection would change which node the next case picks: counted, not ejected
  health: { ejectAfter: 100 },
  nodes: [
    { id: "p0", url: url("p0"), role: "prefill" },
    { id: "d0", url: url("d0"), role: "decode", apiKeySecret: "NODE_TOKEN_D" },
    { id: "d1", url: url("d1"), role: "decode", apiKeySecret: "NODE_TOKEN_D" },
  ],
});
let doc: unknown;

beforeAll(async () => {
  rig = await startRig({
    engines: [
      { id: "p0", role: "prefill" },
      { id: "d0", role: "decode" },
      { id: "d1", role: "decode" },
      // not in the document: where a redirect points
      { id: "x0", role: "decode" },
    ],
    vars: { NODE_TOKEN_D: NODE_TOKEN },
    document: (url, origin) => {
      self = origin;
      doc = document(url);
      return doc;
    },
  });
}, 120000);

afterAll(async () => {
  await rig?.stop();
});

beforeEach(async () => {
  await rig.reset();
});

const decodes = ["d0", "d1"] as const;
const failures = async (node: string) => Number(new RegExp(`pd_router_node_failures_total\\{node="${node}"\\} (\\d+)`).exec(await rig.metrics())?.[1] ?? NaN);

/** The D this session is routed to (affinity: the same for the same x-session-id). */
async function decodeFor(session: string): Promise<string> {
  const res = await request(rig.url, { path: "/v1/route", body: chatBody(), headers: { "x-session-id": session } });
  expect(res.status).toBe(200);
  return JSON.parse(res.body).decode.id;
}

describe("5. a node's own failure statuses count against the node and reach the client as the router's 502", () => {
  it("a D whose apiKeySecret was rotated (401 echoing the token): 502 in the router's words, failures counted", async () => {
    const before = { d0: await failures("d0"), d1: await failures("d1") };
    for (const d of decodes) {
      rig.engine(d).setFault({
        mode: "respond",
        status: 401,
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ error: { message: `invalid token ${NODE_TOKEN}`, type: "authentication_error" } }),
      });
    }
    const res = await request(rig.url, { body: chatBody() });
    expect(res.status).toBe(502);
    const error = JSON.parse(res.body).error;
    expect(error).toMatchObject({ type: "upstream_error" });
    expect(res.body).not.toContain(NODE_TOKEN);
    expect(res.body).not.toContain("invalid token");
    expect(error.message).toMatch(/decode node/);
    // both D nodes were tried, each counted once
    expect(await failures("d0")).toBe(before.d0 + 1);
    expect(await failures("d1")).toBe(before.d1 + 1);
    // each D refused it (a failed vLLM attempt also sends D the handle's release: not counted here)
    const stats = await rig.engineStats();
    expect(stats.d0!.faultsInjected).toBeGreaterThanOrEqual(1);
    expect(stats.d1!.faultsInjected).toBeGreaterThanOrEqual(1);
    // the router sent the node's token, never the client's Authorization
    const sent = rig.engine("d0").requests().at(-1);
    expect(sent.headers.authorization).toBe(`Bearer ${NODE_TOKEN}`);
    await expectReleased(rig, 2000);
  });

  it("one D with a wrong token: the request fails over to the other D and succeeds", async () => {
    const first = await decodeFor("session-401");
    const other = decodes.find((d) => d !== first)!;
    const before = await failures(first);
    rig.engine(first).setFault({ mode: "respond", status: 401, headers: { "content-type": "application/json" }, body: '{"error":{"message":"bad key"}}' });
    const res = await request(rig.url, { body: chatBody(), headers: { "x-session-id": "session-401" } });
    expect(res.status).toBe(200);
    expect(res.headers["x-pd-decode"]).toBe(other);
    expect(await failures(first)).toBe(before + 1);
    expect((await rig.engineStats())[first]!.faultsInjected).toBe(1);
    await expectReleased(rig, 2000);
  });

  it("a D (or a cache in front of it) answering 304: 502, not 500", async () => {
    for (const d of decodes) rig.engine(d).setFault({ mode: "respond", status: 304 });
    const res = await request(rig.url, { body: chatBody() });
    expect(res.status).toBe(502);
    expect(JSON.parse(res.body).error).toMatchObject({ type: "upstream_error" });
    expect(rig.lines().some((l) => l.includes('"event":"unhandled_error"'))).toBe(false);
    await expectReleased(rig, 2000);
  });

  it("a D answering 204 to a stream: 502, not an empty 200", async () => {
    for (const d of decodes) rig.engine(d).setFault({ mode: "respond", status: 204 });
    const res = await request(rig.url, { body: chatBody({ stream: true }) });
    expect(res.status).toBe(502);
    expect(JSON.parse(res.body).error).toMatchObject({ type: "upstream_error" });
    await expectReleased(rig, 2000);
  });
});

describe("7. redirects are never followed: the prompt goes nowhere but the configured nodes", () => {
  it("a D answering 307 to another host: 502, and that host received nothing", async () => {
    const elsewhere = `${rig.engine("x0").url}/v1/chat/completions`;
    for (const d of decodes) rig.engine(d).setFault({ mode: "respond", status: 307, headers: { location: elsewhere } });
    rig.engine("p0").setFault({ mode: "respond", status: 307, headers: { location: elsewhere }, count: 1 });
    const res = await request(rig.url, { body: chatBody() });
    expect(res.status).toBe(502);
    expect(JSON.parse(res.body).error).toMatchObject({ type: "upstream_error" });
    const stats = await rig.engineStats();
    expect(stats.x0!.requests.total).toBe(0);
    expect(rig.engine("x0").requests()).toHaveLength(0);
    await expectReleased(rig, 2000);
  });
});

describe("9. integers beyond 2^53 survive on both legs", () => {
  const bodiesWith = (engine: string, marker: string) => (rig.engine(engine).requests() as Array<{ body: string }>).filter((r) => r.body.includes(marker)).map((r) => r.body);

  it("the client's seed, and a number in P's kv_transfer_params, reach P and D as written", async () => {
    rig.engine("p0").setFault({ mode: "bigint" });
    const marker = `big-${random()}`;
    const res = await request(rig.url, { body: `{"model":"sim-model","messages":[{"role":"user","content":"${marker}"}],"max_tokens":4,"seed":${BIG}}` });
    expect(res.status).toBe(200);
    const p = bodiesWith("p0", marker);
    const d = [...bodiesWith("d0", marker), ...bodiesWith("d1", marker)];
    expect(p).toHaveLength(1);
    expect(d).toHaveLength(1);
    expect(p[0]).toContain(`"seed":${BIG}`);
    expect(d[0]).toContain(`"seed":${BIG}`);
    expect(d[0]).toMatch(new RegExp(`"remote_big_id"\\s*:\\s*${BIG}`));
  });

  it("the same when the client sent router-owned fields (every leg's body is re-written)", async () => {
    rig.engine("p0").setFault({ mode: "bigint" });
    const marker = `big-owned-${random()}`;
    const body = `{"model":"sim-model","messages":[{"role":"user","content":"${marker}"}],"max_tokens":4,"seed":${BIG},"kv_transfer_params":{"do_remote_decode":false,"n":${BIG}},"stream_options":{"include_usage":true},"min_tokens":1}`;
    const res = await request(rig.url, { body });
    expect(res.status).toBe(200);
    const p = bodiesWith("p0", marker);
    const d = [...bodiesWith("d0", marker), ...bodiesWith("d1", marker)];
    expect(p[0]).toContain(`"seed":${BIG}`);
    expect(d[0]).toContain(`"seed":${BIG}`);
    expect(d[0]).toMatch(new RegExp(`"remote_big_id"\\s*:\\s*${BIG}`));
    const stats = await rig.engineStats();
    expect(stats.p0!.violations.concat(stats.d0!.violations, stats.d1!.violations)).toEqual([]);
  });
});

describe("10. a percent-encoded route is the route: one metric series, plain path upstream", () => {
  it("POST /v1/chat/%63ompletions", async () => {
    const marker = `enc-${random()}`;
    const res = await request(rig.url, { path: "/v1/chat/%63ompletions", body: chatBody({ messages: [{ role: "user", content: marker }] }) });
    expect(res.status).toBe(200);
    const metrics = await rig.metrics();
    const series = metrics.split("\n").filter((l) => l.startsWith("pd_router_requests_total{"));
    expect(series.some((l) => l.includes('route="/v1/chat/completions"'))).toBe(true);
    expect(series.filter((l) => /%|ompletions"/.test(l) && !l.includes('route="/v1/chat/completions"') && !l.includes('route="/v1/completions"'))).toEqual([]);
    const seen = ["p0", "d0", "d1"].flatMap((e) => (rig.engine(e).requests() as Array<{ path: string; body: string }>).filter((r) => r.body.includes(marker)).map((r) => r.path));
    expect(seen).toEqual(["/v1/chat/completions", "/v1/chat/completions"]);
  });
});

describe("6/11. a node URL that points at the router: a clear error, no loop", () => {
  /** the router's log lines of requests it refused as a loop, for one client request id (upstream ids start with it) */
  const loopLines = (id: string) => rig.lines().filter((l) => l.includes('"routing_loop"') && l.includes(`"requestId":"${id}`)).length;

  it("written with the router's own origin: 508 before anything is sent", async () => {
    // written through another spelling of the router's origin, so the admin API's check lets it in
    const looping = { ...(doc as object), nodes: [(doc as { nodes: unknown[] }).nodes[0], { id: "dself", url: self, role: "decode" }] };
    const put = await request(rig.url, {
      path: "/admin/nodes",
      method: "PUT",
      body: looping,
      headers: { authorization: "Bearer lifecycle-admin-token", host: `localhost:${rig.port}` },
    });
    expect(put.status, put.body).toBeLessThan(300);
    try {
      const res = await request(rig.url, { body: chatBody() });
      expect(res.status).toBe(508);
      expect(JSON.parse(res.body).error).toMatchObject({ code: "routing_loop" });
      expect(JSON.parse(res.body).error.message).toMatch(/router itself/);
      expect((await rig.engineStats()).p0!.requests.total).toBe(0);

      // reached through another name (a proxy, a DNS alias): the hop header stops it after one hop
      const id = `loop-${Date.now()}`;
      const viaAlias = await request(rig.url, { body: chatBody(), headers: { host: `localhost:${rig.port}`, "x-request-id": id } });
      expect(viaAlias.status).toBeGreaterThanOrEqual(500);
      expect(viaAlias.status).not.toBe(500);
      console.info(`[6] via an alias: ${viaAlias.status} ${viaAlias.body}`);
      // Each request the router sent there is refused at its first hop: the one D attempt, and
      // the vLLM handle's release that a failed attempt sends to D. Two, not 26.
      await until(
        "the refused hop's log line",
        async () => loopLines(id),
        (k) => k > 0,
        2000,
      );
      await sleep(500);
      expect(loopLines(id)).toBeLessThanOrEqual(2);
      expect(JSON.parse(viaAlias.body).error.message).toMatch(/routing loop/);
      await expectReleased(rig, 2000);
      await expectEnginesIdle(rig, 2000);
    } finally {
      await rig.putDocument(doc);
    }
  });
});
