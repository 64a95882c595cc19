// Issue 18 item 3: vLLM's MooncakeConnector with a data-parallel P (vllm-project/vllm
// examples/disaggregated/mooncake_connector/mooncake_connector_proxy.py): P's bootstrap server
// lists one engine id per DP rank; each request uses one rank, P is told which
// (X-data-parallel-rank) and D is given that rank's engine id. With rank 0 always, D would wait
// for a transfer registered under another engine id. The simulator's /query lists rank 0 only,
// so this file runs small fake engines: a P, a bootstrap server listing four ranks, two Ds.
import type http from "node:http";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { admin, bodyOf, json, serve, startDeployRig, until, type DeployRig } from "./deploy-rig";

const RANKS = 4;
const engineId = (rank: number) => `engine-rank-${rank}`;

interface Seen {
  requestId: string;
  rank?: string | undefined;
  model?: string;
  kv: any;
}

/** What the fake engines saw, and how D answers. */
const state = {
  prefill: [] as Seen[],
  decode: { d0: [] as Seen[], d1: [] as Seen[] },
  /** transfer ids whose prefill finished (P answered) */
  prefilled: new Set<string>(),
  /** d0's answer to its next decode leg: a refusal once, then normal */
  d0Next: "ok" as "ok" | "front502" | "busy503",
};

function prefillEngine(req: http.IncomingMessage, res: http.ServerResponse) {
  if (req.method === "GET") return json(res, 200, {});
  void bodyOf(req).then(async (text) => {
    const body = JSON.parse(text);
    state.prefill.push({ requestId: String(req.headers["x-request-id"]), rank: req.headers["x-data-parallel-rank"] as string | undefined, kv: body.kv_transfer_params });
    await new Promise((r) => setTimeout(r, 20));
    state.prefilled.add(body.kv_transfer_params?.transfer_id);
    json(res, 200, {
      id: "chatcmpl-p",
      object: "chat.completion",
      choices: [{ index: 0, message: { role: "assistant", content: "p" }, finish_reason: "length" }],
      usage: { prompt_tokens: 12, completion_tokens: 1, total_tokens: 13 },
      kv_transfer_params: null,
    });
  });
}

function decodeEngine(id: "d0" | "d1") {
  return (req: http.IncomingMessage, res: http.ServerResponse) => {
    if (req.method === "GET") return json(res, 200, {});
    void bodyOf(req).then(async (text) => {
      const body = JSON.parse(text);
      state.decode[id].push({ requestId: String(req.headers["x-request-id"]), model: body.model, kv: body.kv_transfer_params });
      // the release: a model D does not serve, rejected before admission (vLLM's 404)
      if (body.model !== "sim-model") return json(res, 404, { error: { message: `The model \`${body.model}\` does not exist.`, type: "NotFoundError", code: 404 } });
      // D answers once P's prefill for this transfer is done (as a real D waits for the transfer)
      await until("P prefilled", () => state.prefilled.has(body.kv_transfer_params.transfer_id), Boolean, 5000);
      const mode = id === "d0" ? state.d0Next : "ok";
      if (id === "d0") state.d0Next = "ok";
      if (mode === "front502") {
        // "after P finished": the router has read P's answer (its prefill part of the lease ends
        // then, and /admin/status shows it), not merely P sent it — else the router would rightly
        // abort P's leg instead, and there would be nothing to release
        await until(
          "the router read P's answer",
          async () => ((await (await rig.fetch("/admin/status", { headers: admin })).json()) as any).nodes.find((n: any) => n.id === "p0").inflight.prefill as number,
          (n) => n === 0,
          5000,
        );
        // what a tunnel or proxy in front of the engine answers: not the engine's JSON
        res.writeHead(502, { "content-type": "text/html" });
        return res.end("<html><body>502 Bad Gateway</body></html>");
      }
      if (mode === "busy503") return json(res, 503, { error: { message: "The request queue is full.", type: "ServiceUnavailable", code: 503 } }, { "retry-after": "3" });
      json(res, 200, {
        id: "chatcmpl-d",
        object: "chat.completion",
        choices: [{ index: 0, message: { role: "assistant", content: `decoded with ${body.kv_transfer_params.remote_engine_id}` }, finish_reason: "stop" }],
        usage: { prompt_tokens: 12, completion_tokens: 4, total_tokens: 16, prompt_tokens_details: { cached_tokens: 12 } },
      });
    });
  };
}

let rig: DeployRig;
const servers: Array<{ url: string; close: () => Promise<void> }> = [];
let doc: unknown;

beforeAll(async () => {
  const p0 = await serve(prefillEngine);
  const bootstrap = await serve((req, res) => {
    if (req.url !== "/query") return json(res, 404, {});
    // MooncakeBootstrapServer.query: {dp_rank: {engine_id, worker_addr}}
    json(res, 200, Object.fromEntries(Array.from({ length: RANKS }, (_, r) => [String(r), { engine_id: engineId(r), worker_addr: { 0: { 0: `127.0.0.1:${17000 + r}` } } }])));
  });
  const d0 = await serve(decodeEngine("d0"));
  const d1 = await serve(decodeEngine("d1"));
  servers.push(p0, bootstrap, d0, d1);
  rig = await startDeployRig();
  doc = {
    protocol: "vllm-mooncake",
    policy: { prefill: "round_robin", decode: "round_robin" },
    nodes: [
      { id: "p0", url: p0.url, role: "prefill", bootstrapPort: Number(new URL(bootstrap.url).port) },
      { id: "d0", url: d0.url, role: "decode" },
      { id: "d1", url: d1.url, role: "decode" },
    ],
  };
  await rig.putDocument(doc);
}, 60_000);

afterAll(async () => {
  await rig?.stop();
  await Promise.all(servers.map((s) => s.close()));
});

beforeEach(() => {
  state.prefill.length = 0;
  state.decode.d0.length = 0;
  state.decode.d1.length = 0;
  state.d0Next = "ok";
});

const chat = (content: string) => ({ model: "sim-model", messages: [{ role: "user", content }], max_tokens: 4 });
const post = (body: unknown) => rig.fetch("/v1/chat/completions", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
const decodeLegs = () => [...state.decode.d0, ...state.decode.d1].filter((s) => s.model === "sim-model");
const releases = () => [...state.decode.d0, ...state.decode.d1].filter((s) => s.model !== "sim-model");

describe("3. Mooncake with a data-parallel P: a rank per request, P told which, D given that rank's engine id", () => {
  it("requests use P's ranks in turn; each D leg names the engine id of the rank its P leg was sent to", async () => {
    for (let i = 0; i < 2 * RANKS; i++) {
      const res = await post(chat(`dp rank ${i}`));
      expect(res.status).toBe(200);
      const answer = (await res.json()) as any;
      expect(answer.choices[0].message.content).toBe(`decoded with ${engineId(i % RANKS)}`);
    }
    expect(state.prefill.map((p) => p.rank)).toEqual(Array.from({ length: 2 * RANKS }, (_, i) => String(i % RANKS)));
    for (const p of state.prefill) {
      const d = decodeLegs().find((s) => s.requestId === p.requestId)!;
      expect(d.kv.remote_engine_id).toBe(engineId(Number(p.rank)));
      expect(d.kv.transfer_id).toBe(p.kv.transfer_id);
    }
    expect(releases()).toHaveLength(0);
  });
});

describe("3. an unread Mooncake transfer is released the way a NIXL handle is", () => {
  it("D refused by something in front of the engine after P finished: the transfer is released through the next D", async () => {
    state.d0Next = "front502";
    // round robin over d0 and d1: of two requests, one meets d0 first
    for (const content of ["front refusal one", "front refusal two"]) {
      const res = await post(chat(content));
      expect(res.status).toBe(200);
      expect(res.headers.get("x-pd-decode")).toBe("d1");
      await res.arrayBuffer();
    }
    const refused = state.decode.d0.find((s) => s.model === "sim-model")!;
    const [release] = await until("the release reached a D", releases, (r) => r.length === 1);
    // D's own kv_transfer_params, unchanged: D's connector tells P's bootstrap-registered engine to free transfer_id
    expect(release!.kv).toEqual(refused.kv);
    expect(release!.kv.do_remote_prefill).toBe(true);
    expect(state.decode.d1.some((s) => s.model !== "sim-model")).toBe(true);
  });

  it("the engine itself refused (a JSON 503: busy): no release — it told P itself — and the busy D is not counted as failed", async () => {
    const failures = async () => ((await (await rig.fetch("/admin/status", { headers: admin })).json()) as any).nodes.find((n: any) => n.id === "d0").failuresTotal as number;
    const before = await failures();
    state.d0Next = "busy503";
    for (const content of ["busy one", "busy two"]) {
      const res = await post(chat(content));
      expect(res.status).toBe(200);
      expect(res.headers.get("x-pd-decode")).toBe("d1");
      await res.arrayBuffer();
    }
    expect(state.decode.d0.filter((s) => s.model === "sim-model")).toHaveLength(1);
    expect(await failures()).toBe(before);
    await until(
      "leases released",
      async () => ((await (await rig.fetch("/admin/status", { headers: admin })).json()) as any).leases,
      (n) => n === 0,
    );
    expect(releases()).toHaveLength(0);
  });
});
