// Issue 18 item 6, "a retry-after from the engine is honoured": a node that answered 503 or 429 is
// left alone until the time it named (1 s without one, at most 300 s). Models an overloaded vLLM
// or SGLang engine, or a gateway in front of it, shedding load: the router stops sending it
// requests for that long instead of paying a refused round trip on every request. Decode waits at
// the edge when every D is in its window; prefill only puts the busy P last. The window is read
// from the object's snapshot (`busyUntil`, compared with the object's `now`), never timed here.
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { chat, expectNoLoad, type NodeSpec, fault, post, putCluster, received, resetClusterState, resetSim, snapshot } from "./helpers";

const rr = { prefill: "round_robin", decode: "round_robin" };
const busy = (retryAfter: string | null, status = 503) => ({
  mode: "respond",
  status,
  headers: { "content-type": "application/json", ...(retryAfter === null ? {} : { "retry-after": retryAfter }) },
  body: JSON.stringify({ error: { message: "The request queue is full.", type: "ServiceUnavailable", code: status } }),
  count: 1,
});
const node = async (id: string) => (await snapshot()).nodes.find((n) => n.id === id)!;
/** the requests (legs) the engine received, probes and /metrics polls aside */
const calls = async (id: string) => (await received(id)).filter((r) => r.path.startsWith("/v1/") && r.path !== "/v1/models").length;
const PD2: NodeSpec[] = [
  { id: "p0", role: "prefill" },
  { id: "d0", role: "decode" },
  { id: "d1", role: "decode" },
];
const P2D: NodeSpec[] = [
  { id: "p0", role: "prefill" },
  { id: "p1", role: "prefill" },
  { id: "d0", role: "decode" },
];

/** Sends requests until one reaches `id` (round robin: the object's cursor outlives a test), each answered 200. */
async function untilReached(id: string): Promise<void> {
  for (let i = 0; (await calls(id)) === 0; i++) {
    if (i > 10) throw new Error(`no request reached ${id}`);
    const res = await post("/v1/chat/completions", chat(`towards ${id}, ${i}`));
    expect(res.status).toBe(200);
    await res.arrayBuffer();
  }
}

/**
 * Sends requests until `busyId` receives one again (generous deadline). Each request whose answer
 * the object saw before the node's window ended (the snapshot after it is still inside the window)
 * must have gone elsewhere, with nothing reaching the busy node. Returns how many did.
 */
async function trafficUntilBack(busyId: string, header: "x-pd-decode" | "x-pd-prefill", other: string): Promise<number> {
  const until = (await node(busyId)).busyUntil;
  expect(until).not.toBeNull();
  const before = await calls(busyId);
  let inWindow = 0;
  const deadline = Date.now() + 20_000;
  for (let i = 0; (await calls(busyId)) === before; i++) {
    if (Date.now() > deadline) throw new Error(`${busyId} got no request within 20 s of its window`);
    const res = await post("/v1/chat/completions", chat(`after the 503, ${i}`));
    expect(res.status).toBe(200);
    const servedBy = res.headers.get(header);
    await res.arrayBuffer();
    const after = await snapshot();
    if (after.now < until!) {
      inWindow++;
      expect(servedBy).toBe(other);
      expect(await calls(busyId)).toBe(before);
    }
  }
  return inWindow;
}

// Windows of 5 s: long enough that the requests a test sends after the 503 reach the object
// inside the window even on a slow, busy machine.
describe("a node's retry-after is honoured", () => {
  beforeEach(async () => {
    await resetSim();
    await resetClusterState();
  });
  afterEach(resetSim);

  it("a D answering 503 with retry-after 5 once: no request reaches it until the window ends, then it gets traffic again", async () => {
    await putCluster({ protocol: "vllm", policy: rr, nodes: PD2 });
    await fault("d0", busy("5"));
    await untilReached("d0");
    expect(await calls("d0")).toBe(1);
    const d0 = await node("d0");
    // the window is what the engine asked for, counted from when the object heard of it
    expect(d0.busyUntil! - (await snapshot()).now).toBeLessThanOrEqual(5000);
    expect(await trafficUntilBack("d0", "x-pd-decode", "d1")).toBeGreaterThan(0);
    expect(await calls("d0")).toBe(2);
    const after = await node("d0");
    expect(after.busyUntil).toBeNull();
    expect(after.failuresTotal).toBe(0);
    expect(after.breaker).toBe("closed");
    await expectNoLoad();
  });

  it("a 503 that is not the engine's and names no retry-after (an ingress with no ready pod) is the node failing: counted, no window", async () => {
    await putCluster({ protocol: "vllm", policy: rr, nodes: PD2 });
    await fault("d0", { mode: "respond", status: 503, headers: { "content-type": "text/html" }, body: "<html><body>503 Service Temporarily Unavailable</body></html>", count: 1 });
    await untilReached("d0");
    const d0 = await node("d0");
    expect(d0.failuresTotal).toBe(1);
    expect(d0.busyUntil).toBeNull();
    await expectNoLoad();
  });

  it("a P answering 429 with retry-after 5 once: the other P prefills until the window ends, then it is used again", async () => {
    await putCluster({ protocol: "vllm", policy: rr, nodes: P2D });
    await fault("p0", busy("5", 429));
    await untilReached("p0");
    expect(await calls("p0")).toBe(1);
    expect(await trafficUntilBack("p0", "x-pd-prefill", "p1")).toBeGreaterThan(0);
    expect((await node("p0")).failuresTotal).toBe(0);
    await expectNoLoad();
  });

  it("every D in its window: the next request waits at the edge and is served when the earliest window ends, reaching no busy D before", async () => {
    // no probe or /metrics poll runs during the test (their alarm also offers the queue): only the
    // window's end can admit the request before its queueMs runs out (503 cluster_busy)
    await putCluster({
      protocol: "vllm",
      policy: rr,
      nodes: PD2,
      health: { intervalMs: 600_000 },
      signals: { intervalMs: 600_000, staleMs: 1_200_000 },
      admission: { queueMs: 15_000 },
    });
    await fault("d0", busy("5"));
    await fault("d1", busy("5"));
    const refused = await post("/v1/chat/completions", chat("both full"));
    expect(refused.status).toBe(503);
    expect(((await refused.json()) as any).error.code).toBe("upstream_busy");
    expect((await calls("d0")) + (await calls("d1"))).toBe(2);
    const waitedBefore = (await expectNoLoad()).admission.wait.count;

    const res = await post("/v1/chat/completions", chat("waits for the window"));
    expect(res.status).toBe(200);
    expect(res.headers.get("server-timing")).toMatch(/^queue;dur=\d+, /);
    const servedBy = res.headers.get("x-pd-decode")!;
    await res.arrayBuffer();
    // admitted once a window ended (the queue's wake-up), not by a release or a poll: nothing else ran
    expect((await node(servedBy)).busyUntil).toBeNull();
    expect((await calls("d0")) + (await calls("d1"))).toBe(3);
    expect((await snapshot()).admission.wait.count).toBe(waitedBefore + 1);
    await expectNoLoad();
  });

  it("every D in a 60 s window: a request refused at the edge is told to come back when the earliest window ends, not at the next poll", async () => {
    await putCluster({ protocol: "vllm", policy: rr, nodes: PD2, admission: { queueMs: 300 } });
    await fault("d0", busy("60"));
    await fault("d1", busy("60"));
    const opened = await post("/v1/chat/completions", chat("both full for a minute"));
    expect(opened.status).toBe(503);
    await opened.arrayBuffer();
    const res = await post("/v1/chat/completions", chat("refused at the edge"));
    expect(res.status).toBe(503);
    expect(((await res.json()) as any).error.code).toBe("cluster_busy");
    // the poll interval (5 s by default) would say 5
    expect(Number(res.headers.get("retry-after"))).toBeGreaterThanOrEqual(30);
    expect(Number(res.headers.get("retry-after"))).toBeLessThanOrEqual(60);
    await expectNoLoad();
  });

  it("the only P in its window still prefills: prefill never waits or fails for it", async () => {
    await putCluster({
      protocol: "vllm",
      policy: rr,
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
      ],
    });
    await fault("p0", busy("60", 429));
    const refused = await post("/v1/chat/completions", chat("p0 limited"));
    expect(refused.status).toBe(503);
    expect(refused.headers.get("retry-after")).toBe("60");
    await refused.arrayBuffer();
    expect((await node("p0")).busyUntil).not.toBeNull();
    const res = await post("/v1/chat/completions", chat("p0 is all there is"));
    expect(res.status).toBe(200);
    expect(res.headers.get("x-pd-prefill")).toBe("p0");
    await res.arrayBuffer();
    await expectNoLoad();
  });

  it("/v1/route shows the window: the node's busyUntil, its candidate busy and skipped, last among the fallbacks", async () => {
    await putCluster({
      protocol: "vllm",
      policy: rr,
      nodes: [...P2D, { id: "d1", role: "decode" }],
    });
    await fault("p0", busy("60", 429));
    await fault("d0", busy("60"));
    await untilReached("p0");
    await untilReached("d0");
    const route = (await (await post("/v1/route", chat("where would it go"))).json()) as any;
    expect(route.prefill.id).toBe("p1");
    expect(route.decode.id).toBe("d1");
    const candidate = (role: string, id: string) => route.candidates[role].find((c: any) => c.id === id);
    expect(candidate("prefill", "p0")).toMatchObject({ busy: true, skipped: "busy" });
    expect(candidate("decode", "d0")).toMatchObject({ busy: true, skipped: "busy" });
    // a node in its window is the last fallback, not none
    expect(route.prefill.fallbacks).toEqual(["p0"]);
    expect(route.decode.fallbacks).toEqual(["d0"]);
    const busyUntil = Object.fromEntries(route.nodes.map((n: any) => [n.id, n.busyUntil]));
    expect(busyUntil.p0).toBeGreaterThan(Date.now() + 30_000);
    expect(busyUntil.d0).toBeGreaterThan(Date.now() + 30_000);
    expect(busyUntil.p1).toBeNull();
    expect(busyUntil.d1).toBeNull();
    await expectNoLoad();
  });
});
