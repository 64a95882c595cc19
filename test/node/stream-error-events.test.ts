// Error frames inside D's stream, over real TCP against the Worker in workerd. An engine that fails
// after it sent a stream's 200 says so in the stream: `data: {"error": {...}}` then `data: [DONE]`
// (vLLM chat_completion/serving.py: GenerationError, or any exception, through
// create_streaming_error_response; SGLang serving_chat.py: a request the scheduler aborted — a
// decode node whose KV transfer failed answers "KVTransferError(bootstrap_room=...): Aborted by
// AbortReq", code 500; the simulator's SGLang decode does the same for an aborted room).
// Before this, such a stream reached the client as a 200 with its [DONE] and was logged `ok`,
// counted against nobody. Now:
// - as the stream's FIRST event nothing has reached the client (the status line waits for it):
//   the attempt fails like a refused one — failover, blaming P when P failed, else D; a 4xx code
//   (the request was invalid) is passed on and counts against nobody;
// - after tokens: the client's stream ends with the router's `event: error` (not D's frame, no
//   [DONE]), the log says 502 and D (or P) is counted.
// The engines are scripted Node servers, each answering as the engine it stands for.
import type http from "node:http";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { expectOneLogLine, expectReleased, request, sleep, startRig, until, type Rig } from "./lifecycle-harness";
import { sseHead, startScriptedEngine, wait, writeDrained, type ScriptedEngine, type ScriptedRequest } from "./scripted-engine";
import { seededRandom } from "../support/seeded";

const TIMEOUTS = { prefillMs: 3000, decodeFirstByteMs: 3000, decodeIdleMs: 3000, nonStreamMs: 3000 };

/** vLLM's frame for a request whose engine output finished with reason "error" (GenerationError) */
const VLLM_500 = { error: { message: "Internal server error", type: "InternalServerError", param: null, code: 500 } };
/** vLLM's frame for a ValueError raised while streaming: the request's fault */
const VLLM_400 = { error: { message: "'max_tokens' or 'max_completion_tokens' is too large", type: "BadRequestError", param: null, code: 400 } };
const sglangKvError = (room: string) => ({
  error: { object: "error", message: `KVTransferError(bootstrap_room=${room}): Aborted by AbortReq.`, type: "INTERNAL_SERVER_ERROR", param: null, code: 500 },
});
/** json.dumps writes ", " and ": " */
const pyJson = (v: unknown) => JSON.stringify(v).replace(/","/g, '", "').replace(/":/g, '": ');

const token = (text: string) => ({
  id: "chatcmpl-d",
  object: "chat.completion.chunk",
  created: 0,
  model: "sim-model",
  choices: [{ index: 0, delta: { content: text }, finish_reason: null }],
});
const roomOf = (r: ScriptedRequest) => /"bootstrap_room"\s*:\s*(\d+)/.exec(r.body)?.[1] ?? "";

/** How a scripted decode node answers a stream. */
type DecodeScript = { tokens: number; error?: unknown };
/** D streams `tokens` events, then the error frame and [DONE] (or [DONE] alone). */
async function decodeAnswer(res: http.ServerResponse, script: DecodeScript, onError?: () => void): Promise<void> {
  sseHead(res);
  for (let i = 0; i < script.tokens; i++) {
    if (!(await writeDrained(res, `data: ${JSON.stringify(token(` t${i}`))}\n\n`))) return;
    await wait(20);
  }
  if (script.error !== undefined) {
    // the engine writes the frame and [DONE] together (its generator yields both)
    res.end(`data: ${pyJson(script.error)}\n\ndata: [DONE]\n\n`);
    onError?.();
    return;
  }
  res.end("data: [DONE]\n\n");
}

/** P's answers: vLLM's JSON with a handle; SGLang's stream of its one token. */
function prefillAnswer(req: ScriptedRequest, res: http.ServerResponse): void {
  if (req.json.stream === true) {
    sseHead(res);
    return void res.end(`data: ${JSON.stringify(token("x"))}\n\ndata: [DONE]\n\n`);
  }
  res.writeHead(200, { "content-type": "application/json" });
  res.end(
    JSON.stringify({
      id: "p",
      object: "chat.completion",
      choices: [{ index: 0, message: { role: "assistant", content: "x" }, finish_reason: "length" }],
      usage: { prompt_tokens: 5, completion_tokens: 1, total_tokens: 6 },
      kv_transfer_params: {
        do_remote_prefill: true,
        do_remote_decode: false,
        remote_engine_id: "p",
        remote_block_ids: [0],
        remote_host: "127.0.0.1",
        remote_port: 1,
        remote_request_id: req.headers["x-request-id"],
      },
    }),
  );
}

let rig: Rig;
const engines: Record<string, ScriptedEngine> = {};
/** what each scripted decode node does with the next streams */
const dScript: Record<string, DecodeScript> = {};
/** sglang: per room, settled once its D has written its error frame (whichever leg asks first makes it) */
const roomErrored = new Map<string, { done: Promise<void>; settle: () => void }>();
function roomSignal(room: string) {
  let signal = roomErrored.get(room);
  if (!signal) {
    let settle: () => void = () => undefined;
    const done = new Promise<void>((resolve) => {
      settle = resolve;
    });
    signal = { done, settle };
    roomErrored.set(room, signal);
  }
  return signal;
}

beforeAll(async () => {
  // a P that answers well
  engines.p = await startScriptedEngine((req, res) => (req.body ? prefillAnswer(req, res) : void res.end("{}")));
  // an SGLang P whose KV transfer fails: it fails the request (HTTP 500) just after its D reported
  // the aborted transfer in D's stream — the order the router must not be misled by
  engines.pBad = await startScriptedEngine(async (req, res) => {
    if (!req.body) return void res.end("{}");
    await roomSignal(roomOf(req)).done;
    await wait(50);
    res.writeHead(500, { "content-type": "application/json" });
    res.end(JSON.stringify({ object: "error", message: "Prefill transfer failed for request", type: "INTERNAL_SERVER_ERROR", param: null, code: 500 }));
  });
  for (const id of ["dA", "dB"]) {
    dScript[id] = { tokens: 3 };
    engines[id] = await startScriptedEngine(async (req, res) => {
      if (!req.body) return void res.end("{}");
      // sglang: D paired with the failing P (named by the bootstrap port it was given) reports the aborted transfer
      if (req.json.bootstrap_port === 1111) {
        const room = roomOf(req);
        return decodeAnswer(res, { tokens: 0, error: sglangKvError(room) }, () => roomSignal(room).settle());
      }
      return decodeAnswer(res, dScript[id]!);
    });
  }
  rig = await startRig({ engines: [], vars: { LEASE_TTL_MS: 3000, CLIENT_STALL_MS: 2000 }, document: () => doc("vllm", ["p"], ["dA"]) });
}, 120_000);

afterAll(async () => {
  await rig?.stop();
  await Promise.all(Object.values(engines).map((e) => e.close()));
});

function doc(protocol: "vllm" | "sglang", prefill: string[], decode: string[]) {
  return {
    protocol,
    policy: { prefill: "round_robin", decode: "round_robin" },
    timeouts: TIMEOUTS,
    // failures are counted, never ejecting a node between cases
    health: { ejectAfter: 100 },
    nodes: [
      ...prefill.map((id) => ({ id, url: engines[id]!.url, role: "prefill", bootstrapPort: id === "pBad" ? 1111 : 2222 })),
      ...decode.map((id) => ({ id, url: engines[id]!.url, role: "decode" })),
    ],
  };
}

let seq = 0;
const newId = (what: string) => `lse-${what}-${Date.now().toString(36)}-${seq++}`;
const random = seededRandom(152);
const chat = () => ({ model: "sim-model", messages: [{ role: "user", content: `hello ${random()}` }], max_tokens: 8, stream: true });
const failures = async () => Object.fromEntries((await rig.adminStatus()).nodes.map((n) => [n.id, n.failuresTotal]));
const streams = (id: string) => engines[id]!.requests.filter((r) => r.body && r.json.model === "sim-model").length;

/** A streamed chat request over its own connection: status, body, log line. */
async function streamed(what: string) {
  const id = newId(what);
  const res = await request(rig.url, { body: chat(), headers: { "x-request-id": id } });
  return { ...res, log: await expectOneLogLine(rig, id) };
}

describe("D's first event is an error: nothing reached the client, so the attempt fails over", () => {
  it("vllm: D's engine failed the request (500): P runs again and the next D answers; D is counted, the client never sees it", async () => {
    await rig.putDocument(doc("vllm", ["p"], ["dA", "dB"]));
    dScript.dA = { tokens: 0, error: VLLM_500 };
    dScript.dB = { tokens: 3 };
    const before = await failures();
    const sent = { p: streams("p"), dA: streams("dA"), dB: streams("dB") };
    // round robin over two Ds: one of two requests starts on dA
    for (let i = 0; i < 2; i++) {
      const { status, body, headers, log } = await streamed("vllm-first");
      expect(status).toBe(200);
      expect(headers["x-pd-decode"]).toBe("dB");
      expect(body).toContain(" t2");
      expect(body).toContain("data: [DONE]");
      expect(body).not.toContain("error");
      expect(log).toMatchObject({ status: 200, outcome: "ok", decode: "dB" });
    }
    expect(streams("dA") - sent.dA).toBe(1);
    expect(streams("dB") - sent.dB).toBe(2);
    // the handle dA got was single-use: the retry re-ran P for a fresh one
    expect(streams("p") - sent.p).toBe(3);
    await until("dA's failure counted", failures, (f) => f.dA === before.dA! + 1, 3000);
    expect((await failures()).dB).toBe(before.dB);
    await expectReleased(rig, 3000);
  });

  it("vllm: D's first event says the request is invalid (400): the client gets that 400, no other D is tried, nobody is counted", async () => {
    await rig.putDocument(doc("vllm", ["p"], ["dA"]));
    dScript.dA = { tokens: 0, error: VLLM_400 };
    const before = await failures();
    const sent = streams("dA");
    const { status, body, log } = await streamed("vllm-first-400");
    expect(status).toBe(400);
    const error = JSON.parse(body).error;
    expect(error.message).toBe(VLLM_400.error.message);
    expect(error.code).toBe("upstream_rejected");
    expect(log).toMatchObject({ status: 400, outcome: "error" });
    expect(streams("dA") - sent).toBe(1);
    await sleep(300);
    expect(await failures()).toEqual(before);
  });

  it("sglang: D reports its aborted KV transfer and P fails the request just after: P is blamed and replaced, D is not", async () => {
    await rig.putDocument(doc("sglang", ["pBad", "p"], ["dA"]));
    dScript.dA = { tokens: 3 };
    const before = await failures();
    // round robin over two Ps: one of two requests starts on pBad
    for (let i = 0; i < 2; i++) {
      const { status, body, headers, log } = await streamed("sglang-p");
      expect(status).toBe(200);
      expect(headers["x-pd-prefill"]).toBe("p");
      expect(body).toContain(" t2");
      expect(body).toContain("data: [DONE]");
      expect(body).not.toContain("KVTransferError");
      expect(log).toMatchObject({ status: 200, outcome: "ok", prefill: "p", decode: "dA" });
    }
    await until("pBad's failure counted", failures, (f) => f.pBad === before.pBad! + 1, 3000);
    expect((await failures()).dA).toBe(before.dA);
    expect((await failures()).p).toBe(before.p);
    await expectReleased(rig, 3000);
  });

  it("sglang: D reports an error while P answers well: D is blamed and replaced, P is not", async () => {
    await rig.putDocument(doc("sglang", ["p"], ["dA", "dB"]));
    dScript.dA = { tokens: 0, error: sglangKvError("1") };
    dScript.dB = { tokens: 3 };
    const before = await failures();
    for (let i = 0; i < 2; i++) {
      const { status, body, headers } = await streamed("sglang-d");
      expect(status).toBe(200);
      expect(headers["x-pd-decode"]).toBe("dB");
      expect(body).toContain("data: [DONE]");
    }
    await until("dA's failure counted", failures, (f) => f.dA === before.dA! + 1, 3000);
    expect((await failures()).p).toBe(before.p);
    expect((await failures()).dB).toBe(before.dB);
  });
});

describe("an error event after tokens: the router's error event ends the stream, never D's frame nor [DONE]", () => {
  it("vllm, D fails mid-answer (500): the tokens, then `event: error`; logged 502, D counted", async () => {
    await rig.putDocument(doc("vllm", ["p"], ["dA"]));
    dScript.dA = { tokens: 3, error: VLLM_500 };
    const before = await failures();
    const { status, body, log } = await streamed("vllm-mid");
    expect(status).toBe(200);
    expect(body).toContain(" t2");
    const tail = body.slice(body.lastIndexOf(" t2"));
    expect(tail).toContain("event: error");
    expect(tail).toContain('"code":"upstream_stream_error"');
    // D's own frame and its [DONE] were kept from the client
    expect(body).not.toContain("InternalServerError");
    expect(body).not.toContain("[DONE]");
    expect(body.trimEnd().endsWith("}")).toBe(true);
    expect(log).toMatchObject({ status: 502, outcome: "error", decode: "dA" });
    expect(String(log.error)).toContain("Internal server error");
    await until("dA's failure counted", failures, (f) => f.dA === before.dA! + 1, 3000);
    await expectReleased(rig, 3000);
  });

  it("sglang, D's stream aborted mid-answer (KVTransferError, 500): the same; P is not counted", async () => {
    await rig.putDocument(doc("sglang", ["p"], ["dA"]));
    dScript.dA = { tokens: 3, error: sglangKvError("2") };
    const before = await failures();
    const { status, body, log } = await streamed("sglang-mid");
    expect(status).toBe(200);
    expect(body).toContain(" t2");
    expect(body).toContain("event: error");
    expect(body).not.toContain("KVTransferError");
    expect(body).not.toContain("[DONE]");
    expect(log).toMatchObject({ status: 502, outcome: "error" });
    await until("dA's failure counted", failures, (f) => f.dA === before.dA! + 1, 3000);
    expect((await failures()).p).toBe(before.p);
  });

  it("D says mid-answer that the request is invalid (400): the router's error event carries D's reason; logged 400, nobody counted", async () => {
    await rig.putDocument(doc("vllm", ["p"], ["dA"]));
    dScript.dA = { tokens: 3, error: VLLM_400 };
    const before = await failures();
    const { status, body, log } = await streamed("vllm-mid-400");
    expect(status).toBe(200);
    expect(body).toContain(" t2");
    expect(body).toContain("event: error");
    expect(body).toContain('"code":"upstream_rejected"');
    expect(body).toContain(VLLM_400.error.message);
    expect(body).not.toContain("[DONE]");
    expect(log).toMatchObject({ status: 400, outcome: "error" });
    await sleep(300);
    expect(await failures()).toEqual(before);
  });
});
