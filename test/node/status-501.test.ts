// A node's 501 Not Implemented (issue 18/19 follow-up). When the engine itself answers it — a JSON
// error — it says the engine does not support what this request asks: vLLM maps a
// NotImplementedError to 501 (vllm entrypoints/openai/engine/serving.py `create_error_response`),
// SGLang's handlers answer 501 "... does not support streaming requests" (sgl-project/sglang
// entrypoints/openai/serving_base.py). That is the client's request, never a node failure: a
// client that sends it on repeat must not eject every node. A 501 that is not JSON comes from
// something in front of the engine (a proxy that does not implement the method or encoding) and
// would fail every request: that one stays the node's fault. The fake engines below answer the
// engines' own error bodies.
import type http from "node:http";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { admin, bodyOf, json, serve, startDeployRig, type DeployRig } from "./deploy-rig";

/** SGLang's refusal (ORJSONResponse of ErrorResponse, flat) */
const SGLANG_501 = { object: "error", message: "OpenAIServingTokenize does not support streaming requests", type: "NotImplementedError", param: null, code: 501 };
/** vLLM's refusal (ErrorResponse with an ErrorInfo) */
const VLLM_501 = { error: { message: "Embedding prompt not supported for beam search", type: "NotImplementedError", param: null, code: 501 } };

let rig: DeployRig;
const servers: Array<{ url: string; close: () => Promise<void> }> = [];
/** what each fake engine answers a POST, by node */
const answer: Record<string, (req: http.IncomingMessage, res: http.ServerResponse, body: string) => void> = {};
const posts: Record<string, string[]> = {};

function engine(id: string) {
  posts[id] = [];
  return serve(async (req, res) => {
    if (req.method === "GET") return json(res, 200, {});
    const body = await bodyOf(req);
    posts[id]!.push(body);
    answer[id]!(req, res, body);
  });
}

const prefillAnswer = (res: http.ServerResponse) =>
  json(res, 200, {
    id: "cmpl-p",
    object: "chat.completion",
    choices: [{ index: 0, message: { role: "assistant", content: "x" }, finish_reason: "length" }],
    usage: { prompt_tokens: 5, completion_tokens: 1, total_tokens: 6 },
    kv_transfer_params: {
      do_remote_prefill: true,
      do_remote_decode: false,
      remote_engine_id: "p0",
      remote_block_ids: [0],
      remote_host: "127.0.0.1",
      remote_port: 1,
      remote_request_id: "r",
    },
  });

beforeAll(async () => {
  for (const id of ["p0", "d0", "d1", "c0"]) servers.push(await engine(id));
  rig = await startDeployRig();
}, 60_000);

afterAll(async () => {
  await rig?.stop();
  await Promise.all(servers.map((s) => s.close()));
});

beforeEach(() => {
  for (const id of Object.keys(posts)) posts[id]!.length = 0;
});

const url = (i: number) => servers[i]!.url;
const chat = (extra: Record<string, unknown> = {}) => ({ model: "sim-model", messages: [{ role: "user", content: "hello" }], max_tokens: 4, ...extra });
const post = (body: unknown) => rig.fetch("/v1/chat/completions", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
const nodeStatus = async (id: string) => {
  const s = (await (await rig.fetch("/admin/status", { headers: admin })).json()) as any;
  return s.nodes.find((n: any) => n.id === id) as { failuresTotal: number; healthy: boolean; breaker: string };
};

describe("an engine's 501 is the client's unsupported request: passed on, never counted against the node", () => {
  it("colocated, SGLang's 501 on a stream: the client gets 501 with the engine's reason, every time; the node is never counted nor ejected", async () => {
    answer.c0 = (_req, res) => json(res, 501, SGLANG_501);
    await rig.putDocument({ protocol: "colocated", health: { ejectAfter: 2 }, nodes: [{ id: "c0", url: url(3), role: "both" }] });
    for (let i = 0; i < 4; i++) {
      const res = await post(chat({ stream: true }));
      expect(res.status).toBe(501);
      const body = (await res.json()) as any;
      expect(body.error.message).toContain("does not support streaming requests");
      expect(body.error.code).toBe("upstream_rejected");
    }
    // not retried elsewhere (there is nowhere else), and the node took every request: never ejected
    expect(posts.c0).toHaveLength(4);
    expect(await nodeStatus("c0")).toMatchObject({ failuresTotal: 0, healthy: true, breaker: "closed" });
    expect(await (await rig.fetch("/metrics")).text()).toMatch(/pd_router_node_failures_total\{node="c0"\} 0\b/);
  });

  it("vllm, D answers vLLM's 501: the client gets 501, no other D is tried, neither D is counted", async () => {
    answer.p0 = (_req, res) => prefillAnswer(res);
    answer.d0 = (_req, res) => json(res, 501, VLLM_501);
    answer.d1 = (_req, res) => json(res, 501, VLLM_501);
    await rig.putDocument({
      protocol: "vllm",
      policy: { prefill: "round_robin", decode: "round_robin" },
      health: { ejectAfter: 2 },
      nodes: [
        { id: "p0", url: url(0), role: "prefill" },
        { id: "d0", url: url(1), role: "decode" },
        { id: "d1", url: url(2), role: "decode" },
      ],
    });
    for (let i = 0; i < 4; i++) {
      const res = await post(chat({ stream: true, use_beam_search: true }));
      expect(res.status).toBe(501);
      expect(((await res.json()) as any).error.message).toBe("Embedding prompt not supported for beam search");
    }
    // one D a request: the client's request is not retried on the other D (nor P re-run for it)
    expect(posts.d0!.length + posts.d1!.length).toBe(4);
    expect(posts.p0).toHaveLength(4);
    for (const id of ["p0", "d0", "d1"]) expect(await nodeStatus(id)).toMatchObject({ failuresTotal: 0, healthy: true });
  });

  it("a 501 that is not JSON (a proxy in front of the engine) is the node's fault: failover, counted", async () => {
    answer.p0 = (_req, res) => prefillAnswer(res);
    answer.d0 = (_req, res) => {
      res.writeHead(501, { "content-type": "text/html" });
      res.end("<html><body>501 Not Implemented</body></html>");
    };
    answer.d1 = (_req, res) => {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ id: "c", object: "chat.completion", choices: [{ index: 0, message: { role: "assistant", content: "from d1" }, finish_reason: "stop" }] }));
    };
    await rig.putDocument({
      protocol: "vllm",
      policy: { prefill: "round_robin", decode: "round_robin" },
      nodes: [
        { id: "p0", url: url(0), role: "prefill" },
        { id: "d0", url: url(1), role: "decode" },
        { id: "d1", url: url(2), role: "decode" },
      ],
    });
    const before = (await nodeStatus("d0")).failuresTotal;
    // round robin: one of two requests starts on d0, whose proxy refuses; it fails over to d1
    for (let i = 0; i < 2; i++) {
      const res = await post(chat());
      expect(res.status).toBe(200);
      expect(((await res.json()) as any).choices[0].message.content).toBe("from d1");
    }
    expect(posts.d0).toHaveLength(1);
    expect((await nodeStatus("d0")).failuresTotal).toBe(before + 1);
  });
});
