import { SELF } from "cloudflare:test";
import { afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import { chat, post, putCluster, putRawCluster, resetSim } from "./helpers";

const cluster = {
  policy: { prefill: "round_robin", decode: "round_robin" },
  nodes: [
    { id: "p0", role: "prefill" as const, models: ["sim-model"] },
    { id: "d0", role: "decode" as const, models: ["sim-model", "other-model"] },
  ],
};

async function expectEnvelope(res: Response, status: number, param: string | null, code?: string) {
  expect(res.status).toBe(status);
  const body: any = await res.json();
  expect(Object.keys(body)).toEqual(["error"]);
  expect(body.error).toEqual({ message: expect.any(String), type: expect.any(String), param, code: code ?? expect.any(String) });
  expect(body.error.message).not.toMatch(/at .*\.ts:\d+/); // never a stack trace
  return body.error;
}

describe("bad request bodies get a 400 envelope naming the field", () => {
  beforeAll(async () => {
    await resetSim();
    await putCluster(cluster);
  });

  it("invalid JSON", async () => {
    await expectEnvelope(await post("/v1/chat/completions", "{not json"), 400, null, "invalid_json");
  });
  it("a JSON value that is not an object", async () => {
    await expectEnvelope(await post("/v1/chat/completions", "[1,2]"), 400, null, "invalid_json");
  });
  it("missing model", async () => {
    const e = await expectEnvelope(await post("/v1/chat/completions", { messages: [{ role: "user", content: "hi" }] }), 400, "model", "missing_required_parameter");
    expect(e.message).toContain("model");
  });
  it("missing messages", async () => {
    await expectEnvelope(await post("/v1/chat/completions", { model: "sim-model" }), 400, "messages", "missing_required_parameter");
  });
  it("missing prompt", async () => {
    await expectEnvelope(await post("/v1/completions", { model: "sim-model" }), 400, "prompt", "missing_required_parameter");
  });
  it("wrong types", async () => {
    await expectEnvelope(await post("/v1/chat/completions", { model: 42, messages: [] }), 400, "model", "invalid_type");
    await expectEnvelope(await post("/v1/chat/completions", { model: "sim-model", messages: "hi" }), 400, "messages", "invalid_type");
    await expectEnvelope(await post("/v1/chat/completions", { model: "sim-model", messages: [{ content: "x" }] }), 400, "messages[0].role");
    await expectEnvelope(await post("/v1/chat/completions", chat("x", { stream: "yes" })), 400, "stream", "invalid_type");
    await expectEnvelope(await post("/v1/completions", { model: "sim-model", prompt: { text: "x" } }), 400, "prompt");
  });
  it("a body over the limit is 413, by content-length and by a chunked body that lies about nothing", async () => {
    const big = JSON.stringify(chat("x".repeat(11 * 1024 * 1024)));
    await expectEnvelope(await post("/v1/chat/completions", big), 413, null, "request_too_large");
    // No content-length: the body is counted as it streams and cut off at the limit.
    let sent = 0;
    const chunk = new TextEncoder().encode("x".repeat(1024 * 1024));
    const stream = new ReadableStream<Uint8Array>({
      pull(controller) {
        if (sent === 0) controller.enqueue(new TextEncoder().encode('{"model":"sim-model","messages":[{"role":"user","content":"'));
        if (sent++ > 12) return controller.close();
        controller.enqueue(chunk);
      },
    });
    const res = await SELF.fetch("http://router/v1/chat/completions", {
      method: "POST",
      body: stream,
      headers: { "content-type": "application/json" },
      duplex: "half",
    } as RequestInit);
    await expectEnvelope(res, 413, null, "request_too_large");
  });
  it("an unknown route is a 404 envelope", async () => {
    await expectEnvelope(await SELF.fetch("http://router/v2/whatever"), 404, null, "unknown_route");
    await expectEnvelope(await post("/v1/audio/speech", { model: "sim-model", input: "x" }), 404, null, "unknown_route");
  });
  it("an unknown model is a 404 envelope naming model", async () => {
    await expectEnvelope(await post("/v1/chat/completions", chat("x", { model: "gpt-9" })), 404, "model", "model_not_found");
    // served by a D but by no P: still unknown for a disaggregated cluster
    await expectEnvelope(await post("/v1/chat/completions", chat("x", { model: "other-model" })), 404, "model", "model_not_found");
  });
});

describe("GET /v1/models and /healthz", () => {
  it("lists the union of the models the nodes serve", async () => {
    await putCluster(cluster);
    const res = await SELF.fetch("http://router/v1/models");
    expect(res.status).toBe(200);
    const body: any = await res.json();
    expect(body.object).toBe("list");
    expect(body.data.map((m: any) => m.id)).toEqual(["other-model", "sim-model"]);
  });
  it("asks nodes without a models list for theirs", async () => {
    await putCluster({
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode", models: ["extra"] },
      ],
    });
    const body: any = await (await SELF.fetch("http://router/v1/models")).json();
    expect(body.data.map((m: any) => m.id)).toEqual(["extra", "sim-model"]);
  });
  it("/healthz answers without a cluster document", async () => {
    const res = await SELF.fetch("http://router/healthz");
    expect(res.status).toBe(200);
  });
});

describe("the cluster document: invalid ones never take the router down", () => {
  afterEach(() => vi.restoreAllMocks());

  /** The config series of /metrics (open in this project: no METRICS_TOKEN). */
  async function configSeries() {
    const text = await (await SELF.fetch("http://router/metrics")).text();
    const value = (name: string) => Number(new RegExp(`^${name} (\\S+)$`, "m").exec(text)?.[1]);
    return {
      valid: value("pd_router_config_valid"),
      stale: value("pd_router_config_stale"),
      problems: value("pd_router_config_problems"),
      serving: value("pd_router_config_serving"),
    };
  }

  it("keeps serving the last valid document and reports the bad field", async () => {
    await putCluster(cluster);
    expect((await post("/v1/chat/completions", chat("before"))).status).toBe(200);
    expect(await configSeries()).toEqual({ valid: 1, stale: 0, problems: 0, serving: 1 });
    const warnings: string[] = [];
    vi.spyOn(console, "warn").mockImplementation((...args: unknown[]) => void warnings.push(args.map(String).join(" ")));
    const invalid = (): Array<{ path: string; message: string }> =>
      warnings
        .map((l) => JSON.parse(l))
        .filter((e) => e.event === "config_invalid")
        .flatMap((e) => e.problems);

    await putRawCluster(JSON.stringify({ nodes: [{ id: "p0", url: "ftp://10.0.0.1", role: "prefill" }] }));
    const res = await post("/v1/chat/completions", chat("after"));
    expect(res.status).toBe(200);
    expect(res.headers.get("x-pd-decode")).toBe("d0");
    // the log names the field, and /metrics says an older document serves
    expect(invalid().map((p) => p.path)).toContain("nodes[0].url");
    const stale = await configSeries();
    expect(stale).toMatchObject({ valid: 0, stale: 1, serving: 1 });
    expect(stale.problems).toBe(new Set(invalid().map((p) => `${p.path}: ${p.message}`)).size);

    warnings.length = 0;
    await putRawCluster("{ this is not json");
    expect((await post("/v1/chat/completions", chat("still"))).status).toBe(200);
    expect(invalid()).toEqual([{ path: "(document)", message: expect.stringMatching(/JSON/i) }]);
    expect(await configSeries()).toEqual({ valid: 0, stale: 1, problems: 1, serving: 1 });

    // a valid document again: nothing stale any more
    await putCluster(cluster);
    expect((await post("/v1/chat/completions", chat("fixed"))).status).toBe(200);
    expect(await configSeries()).toEqual({ valid: 1, stale: 0, problems: 0, serving: 1 });
  });
});
