import { env, runDurableObjectAlarm, SELF } from "cloudflare:test";
import { beforeEach, describe, expect, it } from "vitest";
import { chat, control, expectNoLoad, fault, post, putCluster, resetClusterState, resetSim, snapshot } from "./helpers";

const rr = { prefill: "round_robin", decode: "round_robin" };
const health = { ejectAfter: 3, ejectBaseMs: 300, ejectMaxMs: 2000, intervalMs: 60000, probeTimeoutMs: 300, downAfter: 2, upAfter: 2 };
const twoByTwo = (extra: Record<string, unknown> = {}) => ({
  protocol: "vllm",
  policy: rr,
  health,
  timeouts: { prefillMs: 400, decodeFirstByteMs: 400 },
  nodes: [
    { id: "p0", role: "prefill" as const },
    { id: "p1", role: "prefill" as const },
    { id: "d0", role: "decode" as const },
    { id: "d1", role: "decode" as const },
  ],
  ...extra,
});

const node = async (id: string) => (await snapshot()).nodes.find((n) => n.id === id)!;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function send(n: number, content = "health") {
  const out: Response[] = [];
  for (let i = 0; i < n; i++) {
    const res = await post("/v1/chat/completions", chat(`${content} ${i}`));
    await res.arrayBuffer();
    out.push(res);
  }
  return out;
}

/** Healthy engines and a Durable Object that remembers no earlier breaker state. */
async function healAll() {
  await resetSim();
  await resetClusterState();
}

describe.each([
  ["down (connection refused)", async (id: string) => control(`/engines/${id}/stop`, {})],
  ["answers 500", (id: string) => fault(id, { mode: "status500" })],
  ["hangs", (id: string) => fault(id, { mode: "hang" })],
  ["resets the connection", (id: string) => fault(id, { mode: "reset" })],
] as const)("a prefill node that %s", (_name, breakIt) => {
  beforeEach(healAll);

  it("fails over, is ejected after the threshold, and comes back after it heals", async () => {
    await putCluster(twoByTwo({ health: { ...health, ejectBaseMs: 400 } }));
    await breakIt("p0");
    // Every request succeeds: a failed P is retried on the other one before anything is sent.
    const first = await send(8);
    for (const res of first) {
      expect(res.status).toBe(200);
      expect(res.headers.get("x-pd-prefill")).toBe("p1");
    }
    const broken = await node("p0");
    expect(broken.failuresTotal).toBe(3);
    expect(broken.breaker).toBe("open");
    expect(broken.healthy).toBe(false);
    // Ejected: no more attempts on p0 while the breaker is open.
    await send(4);
    expect((await node("p0")).failuresTotal).toBe(3);
    await expectNoLoad();

    await control("/reset", {}); // heals every engine (and restarts a stopped one)
    await sleep(500);
    expect((await node("p0")).breaker).toBe("half_open");
    const after = await send(4);
    expect(after.every((r) => r.status === 200)).toBe(true);
    expect(after.some((r) => r.headers.get("x-pd-prefill") === "p0")).toBe(true);
    expect((await node("p0")).breaker).toBe("closed");
    await expectNoLoad();
  });
});

describe("a decode node that fails before its first byte", () => {
  beforeEach(healAll);

  it("is retried on the next decode node; a 4xx does not count against the node", async () => {
    await putCluster(twoByTwo({ health: { ...health, ejectBaseMs: 5000 } }));
    await fault("d0", { mode: "status500" });
    const res = await send(4);
    expect(res.every((r) => r.status === 200 && r.headers.get("x-pd-decode") === "d1")).toBe(true);
    expect((await node("d0")).failuresTotal).toBeGreaterThanOrEqual(2);
    await fault("d0", { mode: "none" });
    await fault("d1", { mode: "status400" });
    const before = (await node("d1")).failuresTotal;
    const rejected = await post("/v1/chat/completions", chat("bad for d1"));
    await rejected.arrayBuffer();
    expect((await node("d1")).failuresTotal).toBe(before);
    await expectNoLoad();
  });
});

describe("a decode node that dies mid-stream", () => {
  beforeEach(healAll);

  it("gives the client an error event, never [DONE], counts a failure and releases the load", async () => {
    await putCluster({
      ...twoByTwo(),
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
      ],
    });
    await fault("d0", { mode: "midstream", afterChunks: 1 });
    const res = await post("/v1/chat/completions", chat("mid", { stream: true, max_tokens: 10 }));
    expect(res.status).toBe(200);
    const text = await res.text();
    expect(text).toContain("event: error");
    expect(text).not.toContain("[DONE]");
    await expectNoLoad();
    expect((await node("d0")).failuresTotal).toBe(1);
  });
});

describe("active health probes from the Durable Object alarm", () => {
  beforeEach(healAll);

  it("marks a node down after downAfter failed probes and up after upAfter good ones; forgets removed nodes", async () => {
    await putCluster(twoByTwo());
    await send(1); // the first routed request hands the document to the Durable Object and arms the alarm
    const stub = env.CLUSTER_STATE.get(env.CLUSTER_STATE.idFromName("cluster"));
    await fault("d1", { health: false });
    expect(await runDurableObjectAlarm(stub)).toBe(true);
    expect((await node("d1")).probeUp).toBe(true); // one failed probe is not enough
    expect(await runDurableObjectAlarm(stub)).toBe(true);
    expect((await node("d1")).probeUp).toBe(false);
    expect((await node("d1")).healthy).toBe(false);
    // the alarm re-armed itself
    expect(await runDurableObjectAlarm(stub)).toBe(true);
    const routed = await send(4);
    expect(routed.every((r) => r.headers.get("x-pd-decode") === "d0")).toBe(true);

    await fault("d1", { health: true });
    await runDurableObjectAlarm(stub);
    expect((await node("d1")).probeUp).toBe(false);
    await runDurableObjectAlarm(stub);
    expect((await node("d1")).probeUp).toBe(true);

    await putCluster({ ...twoByTwo(), nodes: twoByTwo().nodes.filter((n) => n.id !== "d1") });
    await send(1);
    expect((await snapshot()).nodes.map((n) => n.id)).not.toContain("d1");
    await expectNoLoad();
  });
});

describe("with no healthy node for a role", () => {
  beforeEach(healAll);

  it("fails open to the least recently failed node and says so", async () => {
    await putCluster(twoByTwo({ health: { ...health, ejectAfter: 1, ejectBaseMs: 60000, ejectMaxMs: 60000 } }));
    await fault("p0", { mode: "status500", count: 1 });
    await fault("p1", { mode: "status500", count: 1 });
    // both P fail once each: ejected for a minute
    const failed = await post("/v1/chat/completions", chat("both fail"));
    expect(failed.status).toBe(502);
    await failed.arrayBuffer();
    const [p0, p1] = [await node("p0"), await node("p1")];
    expect(p0.healthy || p1.healthy).toBe(false);
    const res = await post("/v1/chat/completions", chat("fail open"));
    expect(res.status).toBe(200);
    expect(res.headers.get("x-pd-fail-open")).toBe("prefill");
    expect(res.headers.get("x-pd-prefill")).toBe(p0.lastFailureAt <= p1.lastFailureAt ? "p0" : "p1");
    await res.arrayBuffer();
    await expectNoLoad();
  });
});

describe("drain", () => {
  beforeEach(healAll);

  it("gives a draining node no new conversations but keeps its existing ones", async () => {
    const doc = (drain: boolean) => ({
      protocol: "vllm",
      policy: { prefill: "affinity", decode: "affinity" },
      health,
      nodes: [
        { id: "p0", role: "prefill" as const, drain },
        { id: "p1", role: "prefill" as const },
        { id: "d0", role: "decode" as const },
      ],
    });
    await putCluster(doc(false));
    // find a few sessions that live on p0
    const onP0: string[] = [];
    for (let i = 0; onP0.length < 3 && i < 60; i++) {
      const res = await post("/v1/chat/completions", chat("hello"), { "x-session-id": `drain-${i}` });
      await res.arrayBuffer();
      if (res.headers.get("x-pd-prefill") === "p0") onP0.push(`drain-${i}`);
    }
    expect(onP0.length).toBe(3);
    await putCluster(doc(true));
    for (const session of onP0) {
      const res = await post("/v1/chat/completions", chat("next turn"), { "x-session-id": session });
      await res.arrayBuffer();
      expect(res.headers.get("x-pd-prefill")).toBe("p0");
    }
    for (let i = 0; i < 10; i++) {
      const res = await post("/v1/chat/completions", chat("new"), { "x-session-id": `fresh-${i}` });
      await res.arrayBuffer();
      expect(res.headers.get("x-pd-prefill")).toBe("p1");
    }
    await expectNoLoad();
  });
});

describe("200 concurrent requests with random client aborts", () => {
  beforeEach(healAll);

  it("leave zero leaked load", async () => {
    await putCluster({
      protocol: "vllm",
      policy: { prefill: "affinity", decode: "affinity" },
      health,
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "p1", role: "prefill" },
        { id: "d0", role: "decode" },
        { id: "slow", role: "decode" },
      ],
    });
    let seed = 42;
    const random = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
    const results = await Promise.all(
      Array.from({ length: 200 }, async (_, i) => {
        const controller = new AbortController();
        const abortAfter = random() < 0.5 ? Math.floor(random() * 60) : null;
        if (abortAfter !== null) setTimeout(() => controller.abort(), abortAfter);
        try {
          const res = await SELF.fetch("http://router/v1/chat/completions", {
            method: "POST",
            headers: { "content-type": "application/json", "x-session-id": `burst-${i % 37}` },
            body: JSON.stringify(chat(`burst ${i}`, { stream: true, max_tokens: 6 })),
            signal: controller.signal,
          });
          await res.text();
          return res.status;
        } catch {
          return "aborted";
        }
      }),
    );
    expect(results.filter((r) => r === 200).length).toBeGreaterThan(50);
    expect(results.every((r) => r === 200 || r === "aborted")).toBe(true);
    await expectNoLoad(15000);
  }, 30000);
});
