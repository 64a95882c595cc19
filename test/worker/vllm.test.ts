import { beforeEach, describe, expect, it } from "vitest";
import { chat, control, expectNoLoad, fault, post, putCluster, received, resetSim } from "./helpers";

const cluster = {
  protocol: "vllm",
  policy: { prefill: "round_robin", decode: "round_robin" },
  nodes: [
    { id: "p0", role: "prefill" as const },
    { id: "d0", role: "decode" as const },
  ],
};

describe("vllm protocol: P then D with kv_transfer_params", () => {
  beforeEach(async () => {
    await resetSim();
    await putCluster(cluster);
  });

  it("sends P the prefill-only body and D the client's body plus P's kv_transfer_params", async () => {
    const body = chat("What is disaggregated serving?", {
      stream: true,
      stream_options: { include_usage: true },
      min_tokens: 2,
      max_completion_tokens: 5,
      temperature: 0.3,
    });
    const res = await post("/v1/chat/completions", body, { "x-request-id": "req-abc", authorization: "Bearer client-secret" });
    expect(res.status).toBe(200);
    expect(res.headers.get("x-pd-prefill")).toBe("p0");
    expect(res.headers.get("x-pd-decode")).toBe("d0");
    expect(res.headers.get("x-request-id")).toBe("req-abc");
    expect(res.headers.get("content-type")).toContain("text/event-stream");
    expect(res.headers.get("server-timing")).toMatch(/route;dur=\d+, prefill;dur=\d+, decode-ttfb;dur=\d+/);
    const text = await res.text();
    expect(text).toContain("data: [DONE]");

    const [p] = await received("p0");
    const [d] = await received("d0");
    const pBody = JSON.parse(p!.body);
    expect(pBody.stream).toBe(false);
    expect(pBody.max_tokens).toBe(1);
    expect(pBody.max_completion_tokens).toBe(1);
    expect(pBody).not.toHaveProperty("stream_options");
    expect(pBody).not.toHaveProperty("min_tokens");
    expect(pBody.temperature).toBe(0.3);
    expect(pBody.kv_transfer_params).toEqual({
      do_remote_decode: true,
      do_remote_prefill: false,
      remote_engine_id: null,
      remote_block_ids: null,
      remote_host: null,
      remote_port: null,
    });
    const dBody = JSON.parse(d!.body);
    expect(dBody.stream).toBe(true);
    expect(dBody.stream_options).toEqual({ include_usage: true });
    expect(dBody.min_tokens).toBe(2);
    expect(dBody.max_completion_tokens).toBe(5);
    expect(dBody.kv_transfer_params.do_remote_prefill).toBe(true);
    expect(dBody.kv_transfer_params.remote_engine_id).toBe("p0");
    expect(p!.headers["x-request-id"]).toMatch(/^req-abc-\w+$/);
    expect(d!.headers["x-request-id"]).toBe(p!.headers["x-request-id"]);
    expect(p!.headers.authorization).toBeUndefined();
    expect(d!.headers.authorization).toBeUndefined();
    await expectNoLoad();
  });

  it("reports cached_tokens from P in a non-streamed answer, not D's", async () => {
    // D reports every prompt token as cached (the KV it pulled counts: sim/engine.mjs, as vLLM's
    // num_cached_tokens includes external tokens), so an answer passed on unrewritten says so.
    const long = "The same long system prompt. ".repeat(400);
    /** What P computed for the request it received last. */
    const prefillRecord = async () => {
      const upstreamId = (await received("p0")).at(-1)!.headers["x-request-id"]!;
      return (await control("/engines/p0/request-stats"))[upstreamId] as { promptTokens: number; cachedTokens: number };
    };
    const cold = await post("/v1/chat/completions", chat(long));
    const coldUsage = ((await cold.json()) as any).usage;
    expect((await prefillRecord()).cachedTokens).toBe(0);
    expect(coldUsage.prompt_tokens_details?.cached_tokens ?? 0).toBe(0);

    const res = await post("/v1/chat/completions", chat(long));
    expect(res.status).toBe(200);
    const json: any = await res.json();
    expect(json.object).toBe("chat.completion");
    // P served the second prefill from its prefix cache, all but the last, partial block
    const p = await prefillRecord();
    expect(p.cachedTokens).toBeGreaterThan(0);
    expect(p.cachedTokens).toBeLessThan(p.promptTokens);
    expect(json.usage.prompt_tokens_details.cached_tokens).toBe(p.cachedTokens);
    expect(json.usage.prompt_tokens).toBe(p.promptTokens);
    await expectNoLoad();
  });

  it("still forwards to D when P stopped on EOS and sent no kv_transfer_params (D prefills itself)", async () => {
    await fault("p0", { mode: "eos", count: 1 });
    const res = await post("/v1/chat/completions", chat("short", { stream: true }));
    expect(res.status).toBe(200);
    expect(await res.text()).toContain("[DONE]");
    const [d] = await received("d0");
    expect(JSON.parse(d!.body)).not.toHaveProperty("kv_transfer_params");
    expect((await control("/engines/d0/stats")).selfPrefills).toBe(1);
    await expectNoLoad();
  });
});
