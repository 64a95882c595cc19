import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { control, engineUrl, expectNoLoad, post, putCluster, received, resetClusterState, resetSim, snapshot } from "./helpers";

// Issue 13 item 2 through the real Worker: /v1/embeddings, /tokenize and /detokenize go one hop
// to a node that serves the model (the client's bytes both ways, failover before the first
// byte, the lease released), and SGLang's native /generate is disaggregated under protocol
// sglang with the bootstrap fields as arrays for a batch.

const rr = { prefill: "round_robin", decode: "round_robin" };
const MAX_ROOM = (1n << 63n) - 1n;

/** The same body sent straight to an engine: what the router must hand back byte for byte. */
async function direct(id: string, path: string, raw: string): Promise<string> {
  const res = await fetch(engineUrl(id) + path, { method: "POST", headers: { "content-type": "application/json" }, body: raw });
  return res.text();
}

async function violations(id: string): Promise<string[]> {
  return (await control(`/engines/${id}/stats`)).violations;
}

describe("one hop: /v1/embeddings", () => {
  beforeEach(async () => {
    await resetSim();
    await resetClusterState();
    // d0 is documented as serving another model only: every sim-model request must reach d1
    await putCluster({
      protocol: "vllm",
      policy: rr,
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode", models: ["other-model"] },
        { id: "d1", role: "decode", models: ["sim-model"] },
      ],
    });
  });

  it("goes to a node that serves the model, the body as the client wrote it, the answer as the node wrote it", async () => {
    for (let i = 0; i < 4; i++) {
      const raw = `{ "model" : "sim-model", "input": ["first text ${i}", "second"], "dimensions": 8, "user": 12345678901234567890 }`;
      const res = await post("/v1/embeddings", raw, { "x-request-id": `emb-${i}` });
      expect(res.status).toBe(200);
      expect(res.headers.get("content-type")).toContain("application/json");
      expect(res.headers.get("x-pd-decode")).toBe("d1");
      expect(res.headers.get("x-pd-prefill")).toBe("d1");
      expect(res.headers.get("x-request-id")).toBe(`emb-${i}`);
      const json: any = await res.json();
      expect(json.object).toBe("list");
      expect(json.data).toHaveLength(2);
      expect(json.data[0].embedding).toHaveLength(8);
      const [got] = (await received("d1")).slice(-1);
      expect(got!.path).toBe("/v1/embeddings");
      expect(got!.body).toBe(raw);
      expect(got!.headers["x-request-id"]).toMatch(new RegExp(`^emb-${i}-\\w+$`));
    }
    // no prefill leg, nothing on the node that does not serve the model
    expect(await received("p0")).toHaveLength(0);
    expect(await received("d0")).toHaveLength(0);
    await expectNoLoad();
  });

  it("without a model: 400 naming it; a model no node serves: 404; nothing forwarded", async () => {
    const missing = await post("/v1/embeddings", { input: "x" });
    expect(missing.status).toBe(400);
    expect(((await missing.json()) as any).error).toMatchObject({ param: "model", code: "missing_required_parameter" });
    const wrongType = await post("/v1/embeddings", { model: 3, input: "x" });
    expect(wrongType.status).toBe(400);
    expect(((await wrongType.json()) as any).error.param).toBe("model");
    const unknown = await post("/v1/embeddings", { model: "no-such-model", input: "x" });
    expect(unknown.status).toBe(404);
    expect(((await unknown.json()) as any).error).toMatchObject({ param: "model", code: "model_not_found" });
    const notJson = await post("/v1/embeddings", "{nope");
    expect(notJson.status).toBe(400);
    for (const id of ["p0", "d0", "d1"]) expect(await received(id)).toHaveLength(0);
    await expectNoLoad();
  });
});

describe("one hop: /tokenize and /detokenize", () => {
  beforeEach(async () => {
    await resetSim();
    await resetClusterState();
    await putCluster({
      protocol: "vllm",
      policy: rr,
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
        { id: "d1", role: "decode" },
      ],
    });
  });
  afterEach(async () => {
    await control("/engines/d0/start", {});
  });

  it("bodies byte for byte both ways, tokenize then detokenize round-trips, with and without a model", async () => {
    const tokRaw = `{"model":"sim-model",  "prompt":"Héllo wörld, tokens ✓","return_token_strs":true}`;
    const tok = await post("/tokenize", tokRaw);
    expect(tok.status).toBe(200);
    const node = tok.headers.get("x-pd-decode")!;
    expect(["d0", "d1"]).toContain(node);
    const tokText = await tok.text();
    expect(tokText).toBe(await direct(node, "/tokenize", tokRaw));
    const [sent] = await received(node);
    expect(sent!.path).toBe("/tokenize");
    expect(sent!.body).toBe(tokRaw);

    const { tokens } = JSON.parse(tokText);
    // no model: any node will do (the tokenizer routes of a one-model cluster are often called so)
    const detokRaw = JSON.stringify({ tokens });
    const detok = await post("/detokenize", detokRaw);
    expect(detok.status).toBe(200);
    const detokText = await detok.text();
    expect(JSON.parse(detokText)).toEqual({ prompt: "Héllo wörld, tokens ✓" });
    const detokNode = detok.headers.get("x-pd-decode")!;
    const [sentDetok] = (await received(detokNode)).filter((r) => r.path === "/detokenize");
    expect(sentDetok!.body).toBe(detokRaw);
    expect(await received("p0")).toHaveLength(0);
    await expectNoLoad();
  });

  it("an engine's own 400 reaches the client as a 400 envelope", async () => {
    const res = await post("/detokenize", { model: "sim-model", tokens: "not a list" });
    expect(res.status).toBe(400);
    const json: any = await res.json();
    expect(Object.keys(json)).toEqual(["error"]);
    await expectNoLoad();
  });

  it("fails over to another node before the first byte when one is down, and releases the lease", async () => {
    await control("/engines/d0/stop", {});
    const raw = `{"model":"sim-model","prompt":"failover please"}`;
    for (let i = 0; i < 4; i++) {
      for (const [path, body] of [
        ["/tokenize", raw],
        ["/detokenize", `{"model":"sim-model","tokens":[${[50859628, 50726254]}]}`],
      ] as const) {
        const res = await post(path, body);
        expect(res.status).toBe(200);
        expect(res.headers.get("x-pd-decode")).toBe("d1");
        expect(await res.text()).toBe(await direct("d1", path, body));
      }
    }
    // the router did try d0 (round robin sends it every other first pick) and counted its failure
    const state = await snapshot();
    expect(state.nodes.find((n: any) => n.id === "d0")!.failuresTotal).toBeGreaterThan(0);
    await expectNoLoad();
  });

  it("every node down: a 502 upstream_unavailable envelope naming the node, the lease released", async () => {
    await putCluster({
      protocol: "vllm",
      policy: rr,
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
      ],
    });
    await control("/engines/d0/stop", {});
    try {
      const res = await post("/tokenize", { model: "sim-model", prompt: "x" });
      expect(res.status).toBe(502);
      expect(res.headers.get("content-type")).toContain("application/json");
      const json = (await res.json()) as any;
      // the OpenAI envelope, and nothing else
      expect(Object.keys(json)).toEqual(["error"]);
      expect(json.error).toMatchObject({ type: "upstream_error", code: "upstream_unavailable" });
      expect(json.error.message).toContain("d0");
      await expectNoLoad();
    } finally {
      await control("/engines/d0/start", {});
    }
  });

  it("the body limit applies", async () => {
    for (const path of ["/tokenize", "/detokenize", "/v1/embeddings", "/generate"]) {
      const res = await post(path, JSON.stringify({ model: "sim-model", prompt: "x".repeat(11 * 1024 * 1024) }));
      expect({ path, status: res.status }).toEqual({ path, status: 413 });
      expect(((await res.json()) as any).error.code).toBe("request_too_large");
    }
    expect(await received("d0")).toHaveLength(0);
    expect(await received("d1")).toHaveLength(0);
  });

  it("counted like every routed request", async () => {
    const before = (await snapshot()).requests.find((r: any) => r.route === "/tokenize" && r.status === 200)?.count ?? 0;
    const res = await post("/tokenize", { model: "sim-model", prompt: "count me" });
    expect(res.status).toBe(200);
    await res.text();
    await expectNoLoad();
    const deadline = Date.now() + 2000;
    let after = before;
    while (after === before && Date.now() < deadline) {
      after = (await snapshot()).requests.find((r: any) => r.route === "/tokenize" && r.status === 200)?.count ?? 0;
      if (after === before) await new Promise((r) => setTimeout(r, 25));
    }
    expect(after).toBe(before + 1);
  });
});

describe("SGLang's native /generate", () => {
  beforeEach(async () => {
    await resetSim();
    await resetClusterState();
  });

  const sglang = () => putCluster({ protocol: "sglang", policy: rr, nodes: [{ id: "p1", role: "prefill", bootstrapPort: 9123 } as any, { id: "d0", role: "decode" }] });

  it("single request: P and D get the same body with scalar bootstrap fields, the room an exact 63-bit integer", async () => {
    await sglang();
    const rooms = new Set<string>();
    for (const stream of [false, true]) {
      const raw = `{"text":"The capital of France is","sampling_params":{"max_new_tokens":4,"seed":12345678901234567890},"stream":${stream}}`;
      const res = await post("/generate", raw);
      expect(res.status).toBe(200);
      expect(res.headers.get("x-pd-prefill")).toBe("p1");
      expect(res.headers.get("x-pd-decode")).toBe("d0");
      const text = await res.text();
      if (stream) {
        expect(res.headers.get("content-type")).toContain("text/event-stream");
        expect(text.trimEnd().endsWith("data: [DONE]")).toBe(true);
        const frames = text
          .split("\n\n")
          .filter((f) => f.startsWith("data: {"))
          .map((f) => JSON.parse(f.slice(6)));
        expect(frames).toHaveLength(4);
        expect(frames.at(-1).meta_info.completion_tokens).toBe(4);
      } else {
        const json = JSON.parse(text);
        expect(json.meta_info.completion_tokens).toBe(4);
        expect(json.text.split(" ").filter(Boolean)).toHaveLength(4);
      }
      const [p] = (await received("p1")).slice(-1);
      const [d] = (await received("d0")).slice(-1);
      expect(p!.path).toBe("/generate");
      expect(d!.body).toBe(p!.body);
      const room = /"bootstrap_room":(\d+)[,}]/.exec(p!.body)![1]!;
      expect(BigInt(room) <= MAX_ROOM).toBe(true);
      rooms.add(room);
      const body = JSON.parse(p!.body);
      expect(body.bootstrap_host).toBe("127.0.0.1");
      expect(body.bootstrap_port).toBe(9123);
      expect(body.stream).toBe(stream);
      expect(p!.body).toContain('"seed":12345678901234567890');
    }
    expect(rooms.size).toBe(2);
    expect(await violations("p1")).toEqual([]);
    expect(await violations("d0")).toEqual([]);
    await expectNoLoad();
  });

  it.each([
    ["text", `["one","two","three"]`],
    ["input_ids", `[[1,2,3],[4,5],[6]]`],
  ])("a batch (%s): bootstrap host, port and room as arrays of the batch size, one exact room each", async (field, items) => {
    await sglang();
    for (const stream of [false, true]) {
      const raw = `{"${field}":${items},"sampling_params":{"max_new_tokens":3},"stream":${stream}}`;
      const res = await post("/generate", raw);
      expect(res.status).toBe(200);
      const text = await res.text();
      if (stream) {
        expect(text).toContain("data: [DONE]");
        const frames = text
          .split("\n\n")
          .filter((f) => f.startsWith("data: {"))
          .map((f) => JSON.parse(f.slice(6)));
        expect(new Set(frames.map((f) => f.index))).toEqual(new Set([0, 1, 2]));
      } else {
        const json = JSON.parse(text);
        expect(Array.isArray(json)).toBe(true);
        expect(json).toHaveLength(3);
      }
      const [p] = (await received("p1")).slice(-1);
      const [d] = (await received("d0")).slice(-1);
      expect(d!.body).toBe(p!.body);
      const body = JSON.parse(p!.body);
      expect(body.bootstrap_host).toEqual(["127.0.0.1", "127.0.0.1", "127.0.0.1"]);
      expect(body.bootstrap_port).toEqual([9123, 9123, 9123]);
      // cut from the text: JSON.parse would round them
      const rooms = /"bootstrap_room":\[([^\]]*)\]/.exec(p!.body)![1]!.split(",");
      expect(rooms).toHaveLength(3);
      for (const room of rooms) {
        expect(room).toMatch(/^\d+$/);
        expect(BigInt(room) <= MAX_ROOM).toBe(true);
      }
      expect(new Set(rooms).size).toBe(3);
    }
    expect(await violations("p1")).toEqual([]);
    expect(await violations("d0")).toEqual([]);
    await expectNoLoad();
  });

  it("a client cannot steer the bootstrap itself", async () => {
    await sglang();
    const res = await post("/generate", { text: "x", sampling_params: { max_new_tokens: 2 }, bootstrap_host: "evil.example", bootstrap_port: 1, bootstrap_room: 7 });
    expect(res.status).toBe(200);
    await res.text();
    // both legs carry the router's bootstrap: P's address and port, a room of its own
    const [p] = await received("p1");
    const [d] = await received("d0");
    expect(d!.body).toBe(p!.body);
    expect(p!.body).not.toContain("evil");
    const body = JSON.parse(p!.body);
    expect({ host: body.bootstrap_host, port: body.bootstrap_port }).toEqual({ host: "127.0.0.1", port: 9123 });
    const room = /"bootstrap_room":(\d+)/.exec(p!.body)![1]!;
    expect(room).not.toBe("7");
    expect(BigInt(room) <= MAX_ROOM).toBe(true);
    expect(await violations("p1")).toEqual([]);
    expect(await violations("d0")).toEqual([]);
    await expectNoLoad();
  });

  it("under protocol vllm or colocated: 404, nothing forwarded", async () => {
    for (const cluster of [
      {
        protocol: "vllm",
        policy: rr,
        nodes: [
          { id: "p0", role: "prefill" as const },
          { id: "d0", role: "decode" as const },
        ],
      },
      { protocol: "colocated", policy: rr, nodes: [{ id: "c0", role: "both" as const }] },
    ]) {
      await putCluster(cluster);
      const res = await post("/generate", { text: "x", sampling_params: { max_new_tokens: 2 } });
      expect(res.status).toBe(404);
      const json: any = await res.json();
      expect(Object.keys(json)).toEqual(["error"]);
      expect(json.error.message).toContain("sglang");
    }
    for (const id of ["p0", "d0", "c0"]) expect(await received(id)).toHaveLength(0);
    await expectNoLoad();
  });
});
