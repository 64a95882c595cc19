// Issue 10 against the strict simulator, sglang protocol: P's answer is read to its end (SGLang
// aborts a request whose connection closes), and health probes that do not flap a busy node.
import { env, runDurableObjectAlarm, SELF } from "cloudflare:test";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { chat, control, engineUrl, expectNoLoad, fault, post, putCluster, resetClusterState, resetSim, snapshot, type NodeSpec } from "./helpers";
import { answerText, expectedPrefix, longPrompt, setOptions, sleep, sseEvents, stats, streamedText, waitFor } from "./engines-helpers";

const rr = { prefill: "round_robin", decode: "round_robin" };
const sglang = (nodes: NodeSpec[], extra: Record<string, unknown> = {}) => putCluster({ protocol: "sglang", policy: rr, nodes, ...extra });
const _P = (id: string): NodeSpec => ({ id, role: "prefill" });
const D = (id: string): NodeSpec => ({ id, role: "decode" });

/** pslow's SGLang bootstrap port is its HTTP port (the document's default is 8998). */
async function pslow(): Promise<NodeSpec> {
  const { bootstrapPort } = await control("/engines/pslow/options");
  return { id: "pslow", role: "prefill", bootstrapPort } as NodeSpec;
}

async function fresh() {
  await resetSim();
  await resetClusterState();
}

describe("sglang: P's response is kept open and read to its end", () => {
  beforeEach(fresh);

  it("long prompts on a busy (slow) P complete, streamed and not; P aborts nothing", async () => {
    await sglang([await pslow(), D("d0")]);
    // three 8k-token prompts queue on P: ~0.4 s each, the last one waits ~1.2 s with its headers sent
    const bodies: Array<ReturnType<typeof chat> & { stream?: boolean }> = [
      chat(longPrompt("sglang busy one", 8000), { stream: true }),
      chat(longPrompt("sglang busy two", 8000), { stream: true }),
      chat(longPrompt("sglang busy three", 8000)),
    ];
    const answers = await Promise.all(
      bodies.map(async (body) => {
        const res = await post("/v1/chat/completions", body);
        return { status: res.status, text: await res.text() };
      }),
    );
    for (const [i, a] of answers.entries()) {
      expect(a.status).toBe(200);
      const text = bodies[i]!.stream ? streamedText(sseEvents(a.text)) : answerText(JSON.parse(a.text));
      expect(a.text).not.toContain("error");
      expect(text.startsWith(expectedPrefix(bodies[i]))).toBe(true);
    }
    const p = await stats("pslow");
    expect(p.requests.sglangPrefill).toBe(3);
    expect(p.sglangAborts).toBe(0);
    expect(p.clientAborts).toBe(0);
    await expectNoLoad();
  });

  it("a D failure aborts P (and only a failure does)", async () => {
    await sglang([await pslow(), D("d0")]);
    const ok = chat(longPrompt("sglang fine", 4000), { stream: true });
    const okRes = await post("/v1/chat/completions", ok);
    expect(okRes.status).toBe(200);
    expect(streamedText(sseEvents(await okRes.text())).startsWith(expectedPrefix(ok))).toBe(true);
    expect((await stats("pslow")).sglangAborts).toBe(0);

    await fault("d0", { mode: "status500" });
    const res = await post("/v1/chat/completions", chat(longPrompt("sglang D fails", 8000), { stream: true }));
    expect(res.status).toBe(502);
    await res.text();
    const p = await waitFor(
      () => stats("pslow"),
      (s) => s.sglangAborts >= 1,
      3000,
      "P aborted",
    );
    expect(p.sglangAborts).toBe(1);
    await expectNoLoad();
  });

  it("a client abort aborts P (and a client that stays does not)", async () => {
    await sglang([await pslow(), D("d0")]);
    // a long streamed prompt: P's headers come at once, its body ~0.4 s later
    const stay = chat(longPrompt("sglang stays", 8000), { stream: true });
    const stayRes = await post("/v1/chat/completions", stay);
    expect(stayRes.status).toBe(200);
    expect(streamedText(sseEvents(await stayRes.text())).startsWith(expectedPrefix(stay))).toBe(true);
    expect((await stats("pslow")).sglangAborts).toBe(0);

    const controller = new AbortController();
    const pending = SELF.fetch("http://router/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(chat(longPrompt("sglang leaves", 8000), { stream: true })),
      signal: controller.signal,
    });
    await waitFor(
      () => stats("pslow"),
      (s) => s.inflight >= 1,
      3000,
      "P got the request",
    );
    await sleep(50);
    controller.abort();
    await expect(pending).rejects.toThrow();
    const p = await waitFor(
      () => stats("pslow"),
      (s) => s.sglangAborts >= 1,
      3000,
      "P aborted",
    );
    expect(p.sglangAborts).toBe(1);
    await expectNoLoad();
  });
});

describe("sglang health probes: a loaded node with a slow, generating /health does not flap", () => {
  beforeEach(fresh);
  afterEach(() => setOptions("pslow", { healthGenerate: false }));

  it("the probe default skips SGLang's generating /health, so a P busy with long prefills stays up", async () => {
    // SGLang's /health runs a generation queued behind the prefills (SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION)
    await setOptions("pslow", { healthGenerate: true });
    await sglang([await pslow(), D("d0")], { health: { intervalMs: 1000, downAfter: 2, upAfter: 1 } });
    // one routed request hands the document to the Durable Object and arms the alarm
    expect((await post("/v1/chat/completions", chat("arm the alarm"))).status).toBe(200);
    // keep P busy for ~3 s of prefills
    const load = Array.from({ length: 8 }, (_, i) => post("/v1/chat/completions", chat(longPrompt(`busy ${i}`, 8000))).then((r) => r.text()));
    await waitFor(
      () => stats("pslow"),
      (s) => s.inflight >= 3,
      3000,
      "P busy",
    );
    // a /health on the busy P takes longer than the probe timeout (intervalMs / 2) would allow
    const started = Date.now();
    const health = await fetch(`${engineUrl("pslow")}/health`);
    expect(health.status).toBe(200);
    expect(Date.now() - started).toBeGreaterThan(500);

    const stub = env.CLUSTER_STATE.get(env.CLUSTER_STATE.idFromName("cluster"));
    // three probe rounds run here (the object's own alarm, due every second, may be running when
    // asked: then there is none to run, and it is asked again), P up after every one
    let ran = 0;
    for (let tries = 0; ran < 3 && tries < 50; tries++) {
      if (await runDurableObjectAlarm(stub)) ran++;
      else await new Promise((r) => setTimeout(r, 100));
      expect((await snapshot()).nodes.find((n) => n.id === "pslow")!.probeUp).toBe(true);
    }
    expect(ran).toBe(3);
    // the probes ran no generation (only the one /health this test made)
    expect((await stats("pslow")).healthGenerations).toBe(1);
    await Promise.all(load);
    await expectNoLoad();
  }, 30000);
});
