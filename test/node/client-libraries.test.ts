// The TypeScript clients people most often put in front of an OpenAI-compatible endpoint — the
// official `openai` SDK (Responses API), the Vercel AI SDK (`ai` 6 with
// `@ai-sdk/openai-compatible`) and LangChain's ChatOpenAI — used as a newcomer would, against the
// real Worker in workerd over TCP, with simulated engines. (The openai SDK's chat and completions
// are covered through SELF.fetch in test/worker/openai-sdk.test.ts.) openai is pinned to 6.x: 7.x
// declares engines node >=22, and the project runs on Node 20 (npm ci warned EBADENGINE).
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { ChatOpenAI } from "@langchain/openai";
import { generateText, streamText } from "ai";
import OpenAI from "openai";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
// @ts-expect-error plain JS module of the simulator
import { startSimCluster } from "../../sim/cluster.mjs";
// @ts-expect-error plain JS module
import { startRouter } from "../../scripts/router-process.mjs";

const ADMIN_TOKEN = "client-tests-admin-token";

let cluster: any;
let router: { url: string; stop: () => Promise<void>; output: () => string };
let persistDir: string;

interface AdminStatus {
  nodes: Array<{ id: string; inflight: { prefill: number; decode: number; tokens: number } }>;
  leases: number;
}

async function adminStatus(): Promise<AdminStatus> {
  const res = await fetch(`${router.url}/admin/status`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
  expect(res.status).toBe(200);
  return (await res.json()) as AdminStatus;
}

async function engineStats(): Promise<Record<string, { clientAborts: number; inflight: number; outputTokens: number; requests: Record<string, number> }>> {
  return (await (await fetch(`${cluster.controlUrl}/stats`)).json()) as any;
}

async function until<T>(what: string, read: () => Promise<T>, ok: (v: T) => boolean, ms = 10000): Promise<T> {
  const end = Date.now() + ms;
  let last: T = await read();
  while (!ok(last)) {
    if (Date.now() > end) throw new Error(`${what}: not reached within ${ms} ms; last seen ${JSON.stringify(last)}`);
    await new Promise((r) => setTimeout(r, 50));
    last = await read();
  }
  return last;
}

/** The router holds no lease and no node counts a request in flight; the engines finished or saw the abort. */
async function expectAllReleased(): Promise<void> {
  const status = await until("leases released", adminStatus, (s) => s.leases === 0 && s.nodes.every((n) => n.inflight.prefill + n.inflight.decode === 0));
  expect(status.nodes.map((n) => n.id).sort()).toEqual(["d0", "d1", "p0", "p1"]);
  await until("engines idle", engineStats, (s) => Object.values(s).every((e) => e.inflight === 0));
}

/** After a client-side abort mid-stream: the D engine saw its client (the router) go away. */
async function expectDecodeAborted(): Promise<void> {
  const stats = await until("D saw the abort", engineStats, (s) => s.d0!.clientAborts + s.d1!.clientAborts === 1);
  // it stopped generating: far fewer than the 400 tokens asked for
  expect(stats.d0!.outputTokens + stats.d1!.outputTokens).toBeLessThan(400);
  await expectAllReleased();
}

beforeAll(async () => {
  cluster = await startSimCluster({
    // decode at 15 ms a token in real time, so a 400-token stream is still running when the client leaves
    defaults: { timeScale: 1, prefillMsPerToken: 0.01 },
    engines: [
      { id: "p0", role: "prefill" },
      { id: "p1", role: "prefill" },
      // D stores the responses it answers and 404s a previous_response_id it never stored (vLLM with its store on)
      { id: "d0", role: "decode", responsesStore: true },
      { id: "d1", role: "decode", responsesStore: true },
    ],
  });
  const url = (id: string) => cluster.engines.get(id).url as string;
  persistDir = await mkdtemp(path.join(tmpdir(), "pd-router-clients-"));
  router = await startRouter({
    runtime: "workerd",
    // workerd binds a free port itself: the router's url names it
    port: 0,
    persistDir,
    vars: { ADMIN_TOKEN, CONFIG_TTL_MS: 0 },
    clusterDocument: {
      protocol: "vllm",
      policy: { prefill: "affinity", decode: "affinity" },
      nodes: [
        { id: "p0", url: url("p0"), role: "prefill" },
        { id: "p1", url: url("p1"), role: "prefill" },
        { id: "d0", url: url("d0"), role: "decode" },
        { id: "d1", url: url("d1"), role: "decode" },
      ],
    },
  });
}, 120000);

afterAll(async () => {
  await router?.stop();
  await cluster?.close();
  if (persistDir) await rm(persistDir, { recursive: true, force: true });
});

beforeEach(async () => {
  await fetch(`${cluster.controlUrl}/reset`, { method: "POST" });
});

describe("Vercel AI SDK (ai 6, @ai-sdk/openai-compatible) through the router", () => {
  const provider = () => createOpenAICompatible({ name: "pd-router", baseURL: `${router.url}/v1`, apiKey: "unused-without-API_KEYS", includeUsage: true });

  it("generateText: a chat answer with usage, prompt tokens reported by P", async () => {
    const { text, usage, finishReason, response } = await generateText({ model: provider().chatModel("sim-model"), prompt: "Say hi", maxOutputTokens: 5, maxRetries: 0 });
    expect(text.split(" ")).toHaveLength(5);
    expect(finishReason).toBe("length");
    expect(usage.outputTokens).toBe(5);
    expect(usage.inputTokens).toBeGreaterThan(0);
    expect(usage.totalTokens).toBe(usage.inputTokens! + 5);
    expect(response.headers?.["x-pd-prefill"]).toMatch(/^p[01]$/);
    expect(response.headers?.["x-pd-decode"]).toMatch(/^d[01]$/);
    await expectAllReleased();
  });

  it("streamText: text deltas as they come, then the final usage", async () => {
    const result = streamText({ model: provider().chatModel("sim-model"), prompt: "Count", maxOutputTokens: 6, maxRetries: 0 });
    const deltas: string[] = [];
    for await (const delta of result.textStream) deltas.push(delta);
    expect(deltas).toHaveLength(6);
    expect((await result.usage).outputTokens).toBe(6);
    expect(await result.finishReason).toBe("length");
    await expectAllReleased();
  });

  it("streamText aborted by the client mid-stream: D sees the disconnect and the lease is released", async () => {
    const ac = new AbortController();
    const result = streamText({
      model: provider().chatModel("sim-model"),
      prompt: "Tell a long story",
      maxOutputTokens: 400,
      maxRetries: 0,
      abortSignal: ac.signal,
      onError: () => {},
    });
    let seen = 0;
    try {
      for await (const _ of result.textStream) {
        if (++seen === 3) ac.abort();
      }
    } catch (error) {
      expect(String(error)).toMatch(/abort/i);
    }
    expect(seen).toBeGreaterThanOrEqual(3);
    expect(seen).toBeLessThan(400);
    await expectDecodeAborted();
  });
});

describe("LangChain ChatOpenAI (@langchain/openai 0.6) through the router", () => {
  const chat = (maxTokens: number) =>
    new ChatOpenAI({ model: "sim-model", apiKey: "unused-without-API_KEYS", configuration: { baseURL: `${router.url}/v1` }, maxTokens, maxRetries: 0 });

  it("invoke: an AIMessage with usage_metadata", async () => {
    const message = await chat(5).invoke([
      ["system", "You are terse."],
      ["human", "Say hi"],
    ]);
    expect(String(message.content).split(" ")).toHaveLength(5);
    expect(message.usage_metadata).toMatchObject({ output_tokens: 5 });
    expect(message.usage_metadata!.input_tokens).toBeGreaterThan(0);
    expect(message.response_metadata).toMatchObject({ finish_reason: "length" });
    await expectAllReleased();
  });

  it("stream: chunks as they come; the last carries usage (stream_options.include_usage)", async () => {
    const stream = await chat(6).stream("Count");
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);
    const text = chunks.map((c) => String(c.content)).join("");
    expect(text.split(" ")).toHaveLength(6);
    const usage = chunks.find((c) => c.usage_metadata)?.usage_metadata;
    expect(usage).toMatchObject({ output_tokens: 6 });
    await expectAllReleased();
  });

  it("stream aborted by the client mid-stream (signal): D sees the disconnect and the lease is released", async () => {
    const ac = new AbortController();
    const stream = await chat(400).stream("Tell a long story", { signal: ac.signal });
    let seen = 0;
    await expect(
      (async () => {
        for await (const _ of stream) if (++seen === 3) ac.abort();
      })(),
    ).rejects.toThrow(/abort/i);
    expect(seen).toBeGreaterThanOrEqual(3);
    await expectDecodeAborted();
  });
});

describe("official openai SDK (openai 6) Responses API through the router", () => {
  const client = () => new OpenAI({ apiKey: "unused-without-API_KEYS", baseURL: `${router.url}/v1`, maxRetries: 0 });

  it("responses.create: the answer, usage with input and cached tokens from P, the P/D headers", async () => {
    const { data, response } = await client()
      .responses.create({ model: "sim-model", instructions: "You are terse.", input: `Say hi ${Date.now()}`, max_output_tokens: 5 })
      .withResponse();
    expect(data.object).toBe("response");
    expect(data.output_text.split(" ")).toHaveLength(5);
    expect(data.usage!.output_tokens).toBe(5);
    expect(data.usage!.input_tokens).toBeGreaterThan(0);
    // a cold prompt: P cached nothing (D, which pulled the KV, would have said all of it)
    expect(data.usage!.input_tokens_details.cached_tokens).toBe(0);
    expect(data.usage!.total_tokens).toBe(data.usage!.input_tokens + 5);
    expect(response.headers.get("x-pd-prefill")).toMatch(/^p[01]$/);
    expect(response.headers.get("x-pd-decode")).toMatch(/^d[01]$/);
    await expectAllReleased();
  });

  it("responses.create streamed: typed events in order, text deltas, response.completed with P's usage", async () => {
    const stream = await client().responses.create({ model: "sim-model", input: `Count ${Date.now()}`, max_output_tokens: 6, stream: true });
    const types: string[] = [];
    let text = "";
    let completed: OpenAI.Responses.Response | undefined;
    for await (const event of stream) {
      types.push(event.type);
      if (event.type === "response.output_text.delta") text += event.delta;
      if (event.type === "response.completed") completed = event.response;
    }
    expect(types[0]).toBe("response.created");
    expect(types.at(-1)).toBe("response.completed");
    expect(types.filter((t) => t === "response.output_text.delta")).toHaveLength(6);
    expect(text.split(" ")).toHaveLength(6);
    expect(
      completed!.output_text ??
        completed!.output
          .flatMap((o: any) => o.content ?? [])
          .map((c: any) => c.text)
          .join(""),
    ).toBe(text);
    expect(completed!.usage!.output_tokens).toBe(6);
    expect(completed!.usage!.input_tokens_details.cached_tokens).toBe(0);
    expect(completed!.usage!.total_tokens).toBe(completed!.usage!.input_tokens + 6);
    await expectAllReleased();
  });

  it("previous_response_id: the follow-up reaches the D that stored the response, streamed or not", async () => {
    for (const stream of [false, true]) {
      for (let c = 0; c < 3; c++) {
        const first = await client().responses.create({ model: "sim-model", input: `Remember ${c} ${stream} ${Date.now()}`, max_output_tokens: 3 });
        // a D that did not store it would answer 404 (vLLM's response store is per engine)
        if (stream) {
          const next = await client().responses.create({ model: "sim-model", input: `And then? ${c}`, previous_response_id: first.id, max_output_tokens: 3, stream: true });
          let done: OpenAI.Responses.Response | undefined;
          for await (const event of next) if (event.type === "response.completed") done = event.response;
          expect(done!.previous_response_id).toBe(first.id);
        } else {
          const next = await client().responses.create({ model: "sim-model", input: `And then? ${c}`, previous_response_id: first.id, max_output_tokens: 3 });
          expect(next.previous_response_id).toBe(first.id);
        }
      }
    }
    await expectAllReleased();
  });

  it("a streamed response aborted by the client: D sees the disconnect and the lease is released", async () => {
    const ac = new AbortController();
    const stream = await client().responses.create({ model: "sim-model", input: "Tell a long story", max_output_tokens: 400, stream: true }, { signal: ac.signal });
    let seen = 0;
    // the SDK's Stream ends its iteration quietly on an abort (openai/core/streaming: isAbortError -> return)
    for await (const event of stream) if (event.type === "response.output_text.delta" && ++seen === 3) ac.abort();
    expect(seen).toBe(3);
    expect(stream.controller.signal.aborted).toBe(true);
    await expectDecodeAborted();
  });
});

describe("LangChain ChatOpenAI with useResponsesApi through the router", () => {
  const chat = (maxTokens: number) =>
    new ChatOpenAI({ model: "sim-model", apiKey: "unused-without-API_KEYS", configuration: { baseURL: `${router.url}/v1` }, maxTokens, maxRetries: 0, useResponsesApi: true });

  it("invoke and stream over /v1/responses", async () => {
    const message = await chat(5).invoke([
      ["system", "You are terse."],
      ["human", `Say hi ${Date.now()}`],
    ]);
    const text = typeof message.content === "string" ? message.content : message.content.map((p: any) => p.text ?? "").join("");
    expect(text.split(" ")).toHaveLength(5);
    expect(message.usage_metadata).toMatchObject({ output_tokens: 5 });
    const chunks = [];
    for await (const chunk of await chat(4).stream("Count")) chunks.push(chunk);
    const streamed = chunks.map((c) => (typeof c.content === "string" ? c.content : c.content.map((p: any) => p.text ?? "").join(""))).join("");
    expect(streamed.split(" ")).toHaveLength(4);
    const stats = await engineStats();
    expect(stats.d0!.requests.vllmDecode + stats.d1!.requests.vllmDecode).toBe(2);
    await expectAllReleased();
  });
});
