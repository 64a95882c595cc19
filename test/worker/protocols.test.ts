import { env, runDurableObjectAlarm, runInDurableObject } from "cloudflare:test";
import { beforeEach, describe, expect, it } from "vitest";
import { chat, expectNoLoad, fault, post, putCluster, received, resetClusterState, resetSim, engineSawAbort } from "./helpers";

const rr = { prefill: "round_robin", decode: "round_robin" };

describe("sglang protocol: concurrent legs with a bootstrap room", () => {
  beforeEach(resetSim);

  it("sends P and D the same body plus bootstrap fields, the room as an exact 63-bit integer", async () => {
    await putCluster({ protocol: "sglang", policy: rr, nodes: [{ id: "p1", role: "prefill", bootstrapPort: 9123 } as any, { id: "d0", role: "decode" }] });
    const rooms = new Set<string>();
    for (let i = 0; i < 4; i++) {
      const raw = JSON.stringify(chat(`sglang ${i}`, { stream: true })).replace(/}$/, ',"seed":12345678901234567890}');
      const res = await post("/v1/chat/completions", raw, { "x-request-id": `sg-${i}` });
      expect(res.status).toBe(200);
      expect(await res.text()).toContain("[DONE]");
    }
    const ps = await received("p1");
    const ds = await received("d0");
    expect(ps).toHaveLength(4);
    expect(ds).toHaveLength(4);
    for (let i = 0; i < 4; i++) {
      // the upstream id is this request's own (the client's id plus a suffix), shared by its P and D
      const p = ps.find((r) => r.headers["x-request-id"]!.startsWith(`sg-${i}-`))!;
      const d = ds.find((r) => r.headers["x-request-id"] === p.headers["x-request-id"])!;
      expect(p.body).toBe(d.body);
      const room = /"bootstrap_room":(\d+)[,}]/.exec(p.body)![1]!;
      expect(BigInt(room) <= (1n << 63n) - 1n).toBe(true);
      rooms.add(room);
      const parsed = JSON.parse(p.body);
      expect(parsed.bootstrap_host).toBe("127.0.0.1");
      expect(parsed.bootstrap_port).toBe(9123);
      expect(parsed.stream).toBe(true);
      // the client's own big integer passes through byte for byte
      expect(p.body).toContain('"seed":12345678901234567890');
    }
    expect(rooms.size).toBe(4);
    await expectNoLoad();
  });

  it("a client cannot steer the KV transfer itself", async () => {
    await putCluster({
      protocol: "sglang",
      policy: rr,
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
      ],
    });
    const res = await post("/v1/chat/completions", chat("x", { bootstrap_host: "evil.example", kv_transfer_params: { remote_host: "evil" } }));
    expect(res.status).toBe(200);
    const [p] = await received("p0");
    expect(JSON.parse(p!.body).bootstrap_host).toBe("127.0.0.1");
    expect(p!.body).not.toContain("evil");
  });
});

describe("sglang: a failed leg aborts its partner", () => {
  beforeEach(async () => {
    await resetSim();
    await resetClusterState();
  });

  it("when P fails, D (waiting for the KV) is aborted and the client gets a 502", async () => {
    await putCluster({
      protocol: "sglang",
      policy: rr,
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
      ],
    });
    await fault("p0", { mode: "status500" });
    const res = await post("/v1/chat/completions", chat("x", { stream: true }));
    expect(res.status).toBe(502);
    expect(((await res.json()) as any).error.message).toContain("p0");
    await engineSawAbort("d0");
    await expectNoLoad();
  });

  it("fails over to another P with a fresh room", async () => {
    await putCluster({
      protocol: "sglang",
      policy: rr,
      nodes: [{ id: "p0", role: "prefill" }, { id: "p1", role: "prefill", bootstrapPort: 9123 } as any, { id: "d0", role: "decode" }],
    });
    await fault("p0", { mode: "status500" });
    const statuses: string[] = [];
    for (let i = 0; i < 3; i++) {
      const res = await post("/v1/chat/completions", chat(`x${i}`, { stream: true }));
      expect(res.status).toBe(200);
      expect(await res.text()).toContain("[DONE]");
      statuses.push(res.headers.get("x-pd-prefill")!);
    }
    expect(statuses).toEqual(["p1", "p1", "p1"]);
    await expectNoLoad();
  });
});

describe("colocated protocol: one hop", () => {
  beforeEach(resetSim);

  it("sends the client's body unchanged to one node that both prefix and decodes", async () => {
    await putCluster({ protocol: "colocated", policy: rr, nodes: [{ id: "c0", role: "both" }] });
    const body = JSON.stringify(chat("colocated", { temperature: 0 }));
    const res = await post("/v1/completions", JSON.stringify({ model: "sim-model", prompt: "Once upon", max_tokens: 3 }));
    expect(res.status).toBe(200);
    expect(res.headers.get("x-pd-prefill")).toBe("c0");
    expect(res.headers.get("x-pd-decode")).toBe("c0");
    const json: any = await res.json();
    expect(json.object).toBe("text_completion");
    const chatRes = await post("/v1/chat/completions", body);
    expect(chatRes.status).toBe(200);
    const logged = await received("c0");
    expect(logged).toHaveLength(2);
    expect(logged[1]!.body).toBe(body);
    await expectNoLoad();
  });
});

describe("node credentials", () => {
  beforeEach(resetSim);

  it("sends the bearer token from the secret a node names, and never the client's", async () => {
    await putCluster({
      protocol: "vllm",
      policy: rr,
      nodes: [
        { id: "p0", role: "prefill", apiKeySecret: "NODE_TOKEN_P0" },
        { id: "d0", role: "decode" },
      ],
    });
    const res = await post("/v1/chat/completions", chat("x"), { authorization: "Bearer client-key" });
    expect(res.status).toBe(200);
    expect((await received("p0"))[0]!.headers.authorization).toBe("Bearer node-secret-p0");
    expect((await received("d0"))[0]!.headers.authorization).toBeUndefined();
  });
});

describe("round robin across P and D, shared by every isolate through the Durable Object", () => {
  beforeEach(resetSim);

  it("rotates each pool evenly", async () => {
    await putCluster({
      protocol: "vllm",
      policy: rr,
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "p1", role: "prefill" },
        { id: "d0", role: "decode" },
        { id: "d1", role: "decode" },
        { id: "d2", role: "decode" },
      ],
    });
    const picks = await Promise.all(
      Array.from({ length: 12 }, async (_, i) => {
        const res = await post("/v1/chat/completions", chat(`rr ${i}`));
        await res.text();
        return [res.headers.get("x-pd-prefill"), res.headers.get("x-pd-decode")] as const;
      }),
    );
    const count = (ids: (string | null)[]) => ids.reduce<Record<string, number>>((m, id) => ((m[id!] = (m[id!] ?? 0) + 1), m), {});
    expect(count(picks.map((p) => p[0]))).toEqual({ p0: 6, p1: 6 });
    expect(count(picks.map((p) => p[1]))).toEqual({ d0: 4, d1: 4, d2: 4 });
    await expectNoLoad();

    // The cursors live in memory on the hot path; the alarm checkpoints them into SQLite.
    const stub = env.CLUSTER_STATE.get(env.CLUSTER_STATE.idFromName("cluster")) as unknown;
    expect(await runDurableObjectAlarm(stub as never)).toBe(true);
    const run = runInDurableObject as unknown as (s: unknown, cb: (instance: any, state: DurableObjectState) => unknown) => Promise<any>;
    const [memory, stored] = await run(stub, (instance, state) => [
      { ...instance.cursors },
      JSON.parse(state.storage.sql.exec<{ value: string }>("SELECT value FROM kv WHERE key = 'cursors'").one().value),
    ]);
    expect(stored).toEqual(memory);
    expect(memory.prefill).toBeGreaterThanOrEqual(12);
  });
});
