import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { control, expectNoLoad, fault, post, putCluster, received, resetClusterState, resetSim, D3, P3 } from "./helpers";

// POST /v1/responses (issue 13 item 1) through the real Worker: disaggregated like chat under
// vllm (P gets max_output_tokens 1 and a handle request, D the client's body plus P's handle),
// refused under sglang (issue 18 item 5), one hop colocated; typed SSE events pass
// through in order, and the usage of the answer / of response.completed comes from P.

/** Fixed keys: a placement that fails fails every run (each file has its own workerd and engines). */
const RUN = "api-responses-run-1";
const rr = { prefill: "round_robin", decode: "round_robin" };
const affinity = { prefill: "affinity", decode: "affinity" };

const responsesBody = (input: unknown = "Explain disaggregated serving", extra: Record<string, unknown> = {}) => ({
  model: "sim-model",
  instructions: "You are terse.",
  input,
  max_output_tokens: 5,
  ...extra,
});

/** `event: <type>\ndata: <json>` frames of a Responses stream, in order. */
function sseEvents(text: string): Array<{ event: string | null; data: any }> {
  return text
    .split("\n\n")
    .filter((frame) => frame.trim())
    .map((frame) => {
      const event = /^event: (.*)$/m.exec(frame)?.[1] ?? null;
      const data = /^data: (.*)$/m.exec(frame)?.[1];
      return { event, data: data === undefined ? undefined : JSON.parse(data) };
    });
}

const EVENT_ORDER = [
  "response.created",
  "response.in_progress",
  "response.output_item.added",
  "response.content_part.added",
  ...Array(5).fill("response.output_text.delta"),
  "response.output_text.done",
  "response.content_part.done",
  "response.output_item.done",
  "response.completed",
];

describe("POST /v1/responses under vllm: P then D with kv_transfer_params", () => {
  beforeEach(async () => {
    await resetSim();
    await putCluster({
      protocol: "vllm",
      policy: rr,
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
      ],
    });
  });

  it("non-streamed: P gets one output token and a handle request, D the client's body plus P's handle; usage from P", async () => {
    const raw = JSON.stringify(responsesBody(`cold prompt ${RUN}`, { temperature: 0.3, metadata: { ticket: "t-1" } })).replace(/}$/, ',"seed":12345678901234567890}');
    const res = await post("/v1/responses", raw, { "x-request-id": "resp-nonstream", authorization: "Bearer client-secret" });
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toContain("application/json");
    expect(res.headers.get("x-pd-prefill")).toBe("p0");
    expect(res.headers.get("x-pd-decode")).toBe("d0");
    expect(res.headers.get("x-request-id")).toBe("resp-nonstream");
    const json: any = await res.json();
    expect(json.object).toBe("response");
    expect(json.id).toMatch(/^resp_/);
    expect(json.output[0].content[0].text.split(" ")).toHaveLength(5);
    // D counts the KV it pulled as cached; the client sees P's view: a cold prompt, nothing cached
    expect(json.usage.input_tokens).toBeGreaterThan(0);
    expect(json.usage.input_tokens_details.cached_tokens).toBe(0);
    expect(json.usage.output_tokens).toBe(5);
    expect(json.usage.total_tokens).toBe(json.usage.input_tokens + 5);

    const [p] = await received("p0");
    const [d] = await received("d0");
    expect(p!.path).toBe("/v1/responses");
    expect(d!.path).toBe("/v1/responses");
    const pBody = JSON.parse(p!.body);
    expect(pBody.stream).toBe(false);
    expect(pBody.max_output_tokens).toBe(1);
    expect(pBody).not.toHaveProperty("max_tokens");
    expect(pBody.instructions).toBe("You are terse.");
    expect(pBody.temperature).toBe(0.3);
    expect(pBody.kv_transfer_params).toEqual({
      do_remote_decode: true,
      do_remote_prefill: false,
      remote_engine_id: null,
      remote_block_ids: null,
      remote_host: null,
      remote_port: null,
    });
    // D: the client's bytes plus P's handle, nothing else changed
    const dBody = JSON.parse(d!.body);
    expect(dBody.kv_transfer_params.do_remote_prefill).toBe(true);
    expect(dBody.kv_transfer_params.remote_engine_id).toBe("p0");
    const { kv_transfer_params: _, ...dRest } = dBody;
    expect(dRest).toEqual({ ...JSON.parse(raw), seed: dRest.seed });
    expect(d!.body).toContain('"seed":12345678901234567890');
    expect(p!.body).toContain('"seed":12345678901234567890');
    expect(d!.headers["x-request-id"]).toBe(p!.headers["x-request-id"]);
    expect(p!.headers["x-request-id"]).toMatch(/^resp-nonstream-\w+$/);
    expect(p!.headers.authorization).toBeUndefined();
    expect(d!.headers.authorization).toBeUndefined();
    await expectNoLoad();
  });

  it("a warm prompt: cached_tokens is what P had cached", async () => {
    const long = `The same long instructions ${RUN}. `.repeat(300);
    const first: any = await (await post("/v1/responses", responsesBody("first", { instructions: long }))).json();
    expect(first.usage.input_tokens_details.cached_tokens).toBe(0);
    const second: any = await (await post("/v1/responses", responsesBody("second", { instructions: long }))).json();
    expect(second.usage.input_tokens_details.cached_tokens).toBeGreaterThan(0);
    expect(second.usage.input_tokens_details.cached_tokens).toBeLessThan(second.usage.input_tokens);
    await expectNoLoad();
  });

  it("streamed: typed events pass through in order, response.completed's usage reconciled from P", async () => {
    const res = await post("/v1/responses", responsesBody(`streamed ${RUN}`, { stream: true }));
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toContain("text/event-stream");
    expect(res.headers.get("x-pd-prefill")).toBe("p0");
    expect(res.headers.get("x-pd-decode")).toBe("d0");
    const text = await res.text();
    // the Responses API ends on response.completed: no chat-style [DONE] added by the router
    expect(text).not.toContain("[DONE]");
    const events = sseEvents(text);
    expect(events.map((e) => e.event)).toEqual(EVENT_ORDER);
    // each frame's data type matches its event line, sequence numbers count from 0 unbroken
    for (const [i, e] of events.entries()) {
      expect(e.data.type).toBe(e.event);
      expect(e.data.sequence_number).toBe(i);
    }
    const deltas = events.filter((e) => e.event === "response.output_text.delta").map((e) => e.data.delta);
    const done = events.find((e) => e.event === "response.output_text.done")!;
    expect(done.data.text).toBe(deltas.join(""));
    const completed = events.at(-1)!.data.response;
    expect(completed.usage.input_tokens).toBeGreaterThan(0);
    expect(completed.usage.input_tokens_details.cached_tokens).toBe(0);
    expect(completed.usage.output_tokens).toBe(5);
    expect(completed.usage.total_tokens).toBe(completed.usage.input_tokens + 5);
    // the other members of the final response are D's, untouched
    expect(completed.id).toBe(events[0]!.data.response.id);
    expect(completed.output[0].content[0].text).toBe(deltas.join(""));

    const [p] = await received("p0");
    const [d] = await received("d0");
    const pBody = JSON.parse(p!.body);
    expect(pBody.stream).toBe(false);
    expect(pBody.max_output_tokens).toBe(1);
    expect(pBody.kv_transfer_params.do_remote_decode).toBe(true);
    const dBody = JSON.parse(d!.body);
    expect(dBody.stream).toBe(true);
    expect(dBody.max_output_tokens).toBe(5);
    expect(dBody.kv_transfer_params.remote_engine_id).toBe("p0");
    await expectNoLoad();
  });

  it("a streamed warm prompt: response.completed carries P's cached_tokens", async () => {
    const long = `Long shared instructions for the stream ${RUN}. `.repeat(300);
    await (await post("/v1/responses", responsesBody("warm-up", { instructions: long }))).text();
    const text = await (await post("/v1/responses", responsesBody("again", { instructions: long, stream: true }))).text();
    const completed = sseEvents(text).at(-1)!;
    expect(completed.event).toBe("response.completed");
    expect(completed.data.response.usage.input_tokens_details.cached_tokens).toBeGreaterThan(0);
    expect(completed.data.response.usage.input_tokens_details.cached_tokens).toBeLessThan(completed.data.response.usage.input_tokens);
    await expectNoLoad();
  });
});

describe("POST /v1/responses: D's first event is its first output, not response.created", () => {
  // vLLM sends response.created and response.in_progress as soon as it takes the request, before
  // its engine has pulled any KV or produced a token (responses/serving.py
  // responses_stream_generator); the status line, the failover window and the time to first token
  // wait for the event after them, as they wait for a chat stream's first token
  beforeEach(resetSim);

  /** p0 and the `slow` engine (real time; no other test of this file uses it) as D, made to step in 0.5 s: its first output comes 0.5 s after its preamble. */
  async function slowFirstOutput(timeouts: Record<string, number> = {}): Promise<void> {
    await putCluster({
      protocol: "vllm",
      policy: rr,
      timeouts,
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "slow", role: "decode" },
      ],
    });
    await control("/engines/slow/options", { decodeBaseMs: 500 });
  }

  it("a D that breaks after response.created and response.in_progress fails over to the other D: the client gets one whole answer, no error", async () => {
    await putCluster({
      protocol: "vllm",
      policy: rr,
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
        { id: "d1", role: "decode" },
      ],
    });
    // d0's streams break after two events: a node whose KV pull failed and whose process died
    await fault("d0", { mode: "midstream", afterChunks: 2 });
    // round-robin: one of each pair tries d0 first; the second pair with an agent's instructions
    // (40 KB, echoed by response.created and response.in_progress: a preamble past 64 KiB)
    const agent = `Agent instructions ${RUN}. `.repeat(1600);
    for (const i of [1, 2, 3, 4]) {
      const res = await post("/v1/responses", responsesBody(`first output ${RUN} ${i}`, { stream: true, ...(i > 2 ? { instructions: agent } : {}) }));
      expect(res.status).toBe(200);
      expect(res.headers.get("x-pd-decode")).toBe("d1");
      const events = sseEvents(await res.text());
      expect(events.map((e) => e.event)).toEqual(EVENT_ORDER);
      expect(events.filter((e) => e.event === "response.created")).toHaveLength(1);
    }
    // d0 was tried with both kinds of request
    const tried = (await received("d0")).filter((r) => r.path === "/v1/responses");
    expect(tried.filter((r) => r.body.includes("Agent instructions")).length).toBeGreaterThan(0);
    expect(tried.filter((r) => !r.body.includes("Agent instructions")).length).toBeGreaterThan(0);
    await expectNoLoad();
  });

  it("D's first output is due within decodeFirstByteMs, as a chat stream's first token is: a 0.5 s first token against 300 ms is a 504", async () => {
    await slowFirstOutput({ decodeFirstByteMs: 300 });
    const res = await post("/v1/responses", responsesBody(`first output due ${RUN}`, { stream: true, max_output_tokens: 2 }));
    expect(res.status).toBe(504);
    expect(((await res.json()) as any).error.code).toBe("upstream_timeout");
    await expectNoLoad();
  });

  it("D's time to first byte is its first output's: a D whose first token takes 0.5 s shows it in server-timing", async () => {
    await slowFirstOutput();
    const res = await post("/v1/responses", responsesBody(`first output timing ${RUN}`, { stream: true, max_output_tokens: 2 }));
    expect(res.status).toBe(200);
    const ttfb = Number(/decode-ttfb;dur=(\d+)/.exec(res.headers.get("server-timing") ?? "")?.[1]);
    expect(ttfb).toBeGreaterThanOrEqual(400);
    expect(sseEvents(await res.text()).at(-1)!.event).toBe("response.completed");
    await expectNoLoad();
  });
});

describe("POST /v1/responses under sglang and colocated", () => {
  beforeEach(resetSim);

  it("sglang: refused with a 400 naming why (SGLang's /v1/responses passes no bootstrap fields to its engine), nothing sent", async () => {
    await putCluster({ protocol: "sglang", policy: rr, nodes: [{ id: "p1", role: "prefill", bootstrapPort: 9123 } as any, { id: "d0", role: "decode" }] });
    for (const stream of [false, true]) {
      const res = await post("/v1/responses", responsesBody(`sglang ${stream} ${RUN}`, { stream }));
      expect(res.status).toBe(400);
      const { error } = (await res.json()) as any;
      expect(error.code).toBe("unsupported_for_protocol");
      expect(error.message).toContain("bootstrap");
    }
    expect(await received("p1")).toHaveLength(0);
    expect(await received("d0")).toHaveLength(0);
    await expectNoLoad();
  });

  it("colocated: one hop, the client's bytes as they are", async () => {
    await putCluster({ protocol: "colocated", policy: rr, nodes: [{ id: "c0", role: "both" }] });
    const raw = JSON.stringify(responsesBody(`colocated ${RUN}`, { stream: true }));
    const res = await post("/v1/responses", raw);
    expect(res.status).toBe(200);
    expect(res.headers.get("x-pd-prefill")).toBe("c0");
    expect(res.headers.get("x-pd-decode")).toBe("c0");
    const events = sseEvents(await res.text());
    expect(events.map((e) => e.event)).toEqual(EVENT_ORDER);
    const [c] = await received("c0");
    expect(c!.path).toBe("/v1/responses");
    expect(c!.body).toBe(raw);
    await expectNoLoad();
  });
});

describe("POST /v1/responses affinity", () => {
  beforeEach(async () => {
    await resetSim();
    await resetClusterState();
    await putCluster({ protocol: "vllm", policy: affinity, nodes: [...P3, ...D3] });
  });

  const place = async (body: unknown) => {
    const res = await post("/v1/responses", body);
    expect(res.status).toBe(200);
    const json: any = await res.json();
    return { id: json.id as string, p: res.headers.get("x-pd-prefill")!, d: res.headers.get("x-pd-decode")! };
  };

  it("two turns with the same instructions and first input land on the same P and D", async () => {
    const placements = new Set<string>();
    for (let c = 0; c < 6; c++) {
      const first = { role: "user", content: `Conversation ${c} of ${RUN}: my deployment returns 502.` };
      const one = await place(responsesBody([first], { instructions: `Support assistant ${RUN}` }));
      const two = await place(
        responsesBody([first, { role: "assistant", content: "Check the decode pool." }, { role: "user", content: "Still failing." }], { instructions: `Support assistant ${RUN}` }),
      );
      expect(two.p).toBe(one.p);
      expect(two.d).toBe(one.d);
      placements.add(`${one.p}/${one.d}`);
    }
    // the key spreads conversations over the nodes rather than pinning them all to one pair
    expect(placements.size).toBeGreaterThan(1);
    await expectNoLoad();
  });

  it("a previous_response_id turn reaches the nodes that served that response, streamed or not", async () => {
    for (const stream of [false, true]) {
      for (let c = 0; c < 4; c++) {
        let first: { id: string; p: string; d: string };
        if (stream) {
          const res = await post("/v1/responses", responsesBody(`Stored conversation ${c} ${stream} ${RUN}`, { stream: true }));
          const events = sseEvents(await res.text());
          first = { id: events.at(-1)!.data.response.id, p: res.headers.get("x-pd-prefill")!, d: res.headers.get("x-pd-decode")! };
        } else {
          first = await place(responsesBody(`Stored conversation ${c} ${stream} ${RUN}`));
        }
        // the finish report that remembers the nodes runs after the response: let it land
        await expectNoLoad();
        // a follow-up whose own text would hash elsewhere: only the response id ties it to the first turn
        for (let t = 0; t < 3; t++) {
          const next = await place(responsesBody(`Unrelated follow-up ${t} ${c} ${RUN}`, { instructions: `Other ${t}`, previous_response_id: first.id }));
          // D holds the stored response and the history: it takes the turn alone and prefills it
          // itself (P would answer 404 for an id it never stored), so both headers name D
          expect({ stream, c, turn: t, p: next.p, d: next.d }).toEqual({ stream, c, turn: t, p: first.d, d: first.d });
        }
        const [lastD] = (await received(first.d)).slice(-1);
        expect(JSON.parse(lastD!.body).previous_response_id).toBe(first.id);
        expect(JSON.parse(lastD!.body)).not.toHaveProperty("kv_transfer_params");
        expect((await received(first.p)).some((r) => r.body.includes(first.id))).toBe(false);
      }
    }
    await expectNoLoad();
  });
});

describe("POST /v1/responses: a stored response's D is kept under every policy", () => {
  it.each(["round_robin", "least_load"])("%s: every previous_response_id turn reaches the D that stored the response", async (name) => {
    await resetSim();
    await resetClusterState();
    await putCluster({ protocol: "vllm", policy: { prefill: name, decode: name }, nodes: [...P3, ...D3] });
    for (let c = 0; c < 3; c++) {
      const res = await post("/v1/responses", responsesBody(`Stored under ${name} ${c} ${RUN}`));
      expect(res.status).toBe(200);
      const first = { id: ((await res.json()) as any).id as string, d: res.headers.get("x-pd-decode")! };
      await expectNoLoad();
      // without the pin, round robin and least load would spread these turns over all three D
      for (let t = 0; t < 3; t++) {
        const next = await post("/v1/responses", responsesBody(`Follow-up ${t}`, { previous_response_id: first.id }));
        expect(next.status).toBe(200);
        await next.arrayBuffer();
        expect(next.headers.get("x-pd-decode")).toBe(first.d);
      }
    }
    await expectNoLoad();
  });
});

describe("POST /v1/responses validation", () => {
  beforeEach(async () => {
    await resetSim();
    await putCluster({
      protocol: "vllm",
      policy: rr,
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
      ],
    });
  });
  afterEach(() => vi.restoreAllMocks());

  it.each([
    ["input missing", { model: "sim-model" }, "input"],
    ["input a number", { model: "sim-model", input: 3 }, "input"],
    ["model missing", { input: "hi" }, "model"],
    ["max_output_tokens zero", { model: "sim-model", input: "hi", max_output_tokens: 0 }, "max_output_tokens"],
    ["instructions not a string", { model: "sim-model", input: "hi", instructions: 7 }, "instructions"],
    ["previous_response_id not a string", { model: "sim-model", input: "hi", previous_response_id: 1 }, "previous_response_id"],
    ["stream not a boolean", { model: "sim-model", input: "hi", stream: "yes" }, "stream"],
  ])("400 naming the field: %s", async (_, body, param) => {
    const res = await post("/v1/responses", body);
    expect(res.status).toBe(400);
    const json: any = await res.json();
    expect(json.error).toMatchObject({ type: "invalid_request_error", param });
    expect(json.error.message).toContain(param);
    // nothing reached the engines
    expect(await received("p0")).toHaveLength(0);
    expect(await received("d0")).toHaveLength(0);
  });

  it("400 for a body that is not JSON, and 404 for a model no node serves", async () => {
    const bad = await post("/v1/responses", "{not json");
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as any).error.code).toBe("invalid_json");
    await putCluster({
      protocol: "vllm",
      policy: rr,
      nodes: [
        { id: "p0", role: "prefill", models: ["sim-model"] },
        { id: "d0", role: "decode", models: ["sim-model"] },
      ],
    });
    const missing = await post("/v1/responses", responsesBody("x", { model: "other-model" }));
    expect(missing.status).toBe(404);
    expect(((await missing.json()) as any).error).toMatchObject({ code: "model_not_found", param: "model" });
  });
});
