// Issue 19, item 2, over real TCP against the Worker in workerd: under `sglang` (and
// `vllm-mooncake`, the same concurrent-legs code) P and D run at once, so P can fail after D's
// stream has begun. A leg aborted because its partner failed is not a client departure: the
// client's stream ends with an error event (never [DONE], never a clean end), the log line says
// P failed (502), and P's failure counts against P. The engines are scripted Node servers: P
// fails only once D has streamed three events, which the simulator cannot time on purpose.
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { RawClient, expectOneLogLine, expectReleased, startRig, until, type Rig } from "./lifecycle-harness";
import { closed, sseHead, startScriptedEngine, wait, writeDrained, type ScriptedEngine, type ScriptedRequest } from "./scripted-engine";
import { seededRandom } from "../support/seeded";

const PREFILL_MS = 1500;
const TIMEOUTS = { prefillMs: PREFILL_MS, decodeFirstByteMs: 3000, decodeIdleMs: 3000, nonStreamMs: 3000 };
const EJECT_AFTER = 3;
/** D streams this many events, one each 50 ms: ~4 s, past every bound checked here */
const D_EVENTS = 80;

type PrefillFault = "none" | "error" | "reset" | "hang";
let fault: PrefillFault = "none";

/** D's progress per bootstrap room (sglang) or transfer id (mooncake): how many events it has streamed. */
const streamed = new Map<string, number>();
const waiters = new Map<string, Array<() => void>>();
const pairKey = (r: ScriptedRequest) => /"bootstrap_room"\s*:\s*(\d+)/.exec(r.body)?.[1] ?? /"transfer_id"\s*:\s*"([^"]+)"/.exec(r.body)?.[1] ?? "";
function progress(key: string, n: number) {
  streamed.set(key, n);
  for (const w of waiters.get(key) ?? []) w();
}
async function untilStreamed(key: string, n: number, res: import("node:http").ServerResponse): Promise<boolean> {
  while ((streamed.get(key) ?? 0) < n) {
    if (res.destroyed) return false;
    await new Promise<void>((resolve) => {
      const list = waiters.get(key) ?? [];
      list.push(resolve);
      waiters.set(key, list);
      setTimeout(resolve, 100);
    });
  }
  return true;
}

let rig: Rig;
let p: ScriptedEngine;
let d: ScriptedEngine;
let protocol: "sglang" | "vllm-mooncake" = "sglang";
const document = () => ({
  protocol,
  policy: { prefill: "round_robin", decode: "round_robin" },
  timeouts: TIMEOUTS,
  health: { ejectAfter: EJECT_AFTER, ejectBaseMs: 600000, ejectMaxMs: 600000 },
  nodes: [
    { id: "p0", url: p.url, role: "prefill", bootstrapPort: Number(new URL(p.url).port) },
    { id: "d0", url: d.url, role: "decode" },
  ],
});

beforeAll(async () => {
  // SGLang's P answers a stream at once with its SSE headers, then its one token; vLLM's
  // Mooncake P answers JSON when its prefill is done (and serves /query on its bootstrap port).
  p = await startScriptedEngine(async (req, res) => {
    if (req.path === "/query") return void res.end(JSON.stringify({ "0": { engine_id: "scripted-p0" } }));
    if (!req.body) return void res.end('{"object":"list","data":[]}');
    const stream = req.json.stream === true;
    if (stream) sseHead(res);
    const key = pairKey(req);
    if (fault !== "none") {
      // P fails only once its partner D has streamed three events to the router
      if (!(await untilStreamed(key, 3, res))) return;
      if (fault === "hang") return closed(res);
      if (fault === "reset") return void res.socket?.destroy();
      // SGLang's stream generator yields create_streaming_error_response(...) then [DONE]
      // (sgl-project/sglang entrypoints/openai/serving_chat.py); a JSON answer fails by status
      if (stream)
        return void res.end(`data: ${JSON.stringify({ error: { message: "KV transfer failed", type: "InternalServerError", param: null, code: 500 } })}\n\ndata: [DONE]\n\n`);
      res.writeHead(500, { "content-type": "application/json" });
      return void res.end(JSON.stringify({ error: { message: "KV transfer failed", type: "InternalServerError", code: 500 } }));
    }
    const chunk = { id: "p", object: "chat.completion.chunk", created: 0, model: "sim-model", choices: [{ index: 0, delta: { content: "x" }, finish_reason: "length" }] };
    if (stream) return void res.end(`data: ${JSON.stringify(chunk)}\n\ndata: [DONE]\n\n`);
    res.writeHead(200, { "content-type": "application/json" });
    res.end(
      JSON.stringify({
        id: "p",
        object: "chat.completion",
        choices: [{ index: 0, message: { role: "assistant", content: "x" }, finish_reason: "length" }],
        usage: { prompt_tokens: 5, completion_tokens: 1, total_tokens: 6 },
      }),
    );
  });
  d = await startScriptedEngine(async (req, res) => {
    if (!req.body) return void res.end('{"object":"list","data":[]}');
    sseHead(res);
    const key = pairKey(req);
    const events = fault === "none" ? 5 : D_EVENTS;
    for (let i = 0; i < events; i++) {
      const chunk = { id: "d", object: "chat.completion.chunk", created: 0, model: "sim-model", choices: [{ index: 0, delta: { content: ` w${i}` }, finish_reason: null }] };
      if (!(await writeDrained(res, `data: ${JSON.stringify(chunk)}\n\n`))) return;
      progress(key, i + 1);
      await wait(50);
      if (res.destroyed) return;
    }
    res.end("data: [DONE]\n\n");
  });
  rig = await startRig({ engines: [], vars: { LEASE_TTL_MS: 3000, CLIENT_STALL_MS: 2000 }, document: () => document() });
}, 120000);

afterAll(async () => {
  await rig?.stop();
  await p?.close();
  await d?.close();
});

beforeEach(async () => {
  fault = "none";
});

/** A request that goes well: the pair works, and P's failure streak starts again from 0. */
async function goodRequest() {
  fault = "none";
  const client = new RawClient(rig.port, { body: chat() });
  expect(await client.waitEnded(5000)).toBe(true);
  const { status, body } = client.response();
  expect(status).toBe(200);
  expect(body).toContain("data: [DONE]");
  expect(body).not.toContain("event: error");
}

let seq = 0;
const newId = (what: string) => `lcp-${what}-${Date.now().toString(36)}-${seq++}`;
const random = seededRandom(129);
const chat = () => ({ model: "sim-model", messages: [{ role: "user", content: `hello ${random()}` }], max_tokens: D_EVENTS, stream: true });
const p0 = async () => (await rig.adminStatus()).nodes.find((n) => n.id === "p0")!;
const d0 = async () => (await rig.adminStatus()).nodes.find((n) => n.id === "d0")!;

/** One streamed request whose P fails (as `f`) after D's first events: what the client, D, the log and the counters saw. */
async function prefillFailsMidStream(f: PrefillFault, what: string, reset = true) {
  if (reset) await goodRequest();
  fault = f;
  const before = { p: (await p0()).failuresTotal, d: (await d0()).failuresTotal };
  const id = newId(f);
  const dRequests = d.requests.length;
  const client = new RawClient(rig.port, { body: chat(), headers: { "x-request-id": id } });
  expect(await client.waitEnded(PREFILL_MS + 5000)).toBe(true);
  const { status, body } = client.response();
  // the status line went out with D's first byte; P failed after it
  expect(status).toBe(200);
  expect(body).toContain('data: {"id":"d"');
  expect(body).toContain("event: error");
  expect(body).toContain('"code":"upstream_prefill_failed"');
  expect(body).not.toContain("[DONE]");
  expect(body.trimEnd().endsWith("}")).toBe(true);
  // D's leg was closed: it never finished its answer for nobody
  // closedEarly tells a stream the router closed from one D finished; the bound only ends a hang
  await until(
    "D's stream closed by the router",
    async () => d.requests.slice(dRequests).every((r) => r.closedEarly),
    (ok) => ok,
    10000,
  );
  expect(d.requests.slice(dRequests)).toHaveLength(1);
  const log = await expectOneLogLine(rig, id);
  expect(log).toMatchObject({ status: 502, outcome: "error" });
  expect(String(log.error)).toMatch(/prefill node p0/);
  // P's failure counts against P, D's leg (aborted because of P) not against D
  await until(
    "P's failure counted",
    async () => (await p0()).failuresTotal,
    (n) => n === before.p + 1,
    3000,
  );
  expect((await d0()).failuresTotal).toBe(before.d);
  await expectReleased(rig, 3000);
  console.info(`[p-${f}] ${what}: ${log.error}`);
}

describe("2. sglang: P fails after D's first byte — an error event, P blamed, never a silent truncated 200", () => {
  it("P answers its stream with an SGLang error event (a KV transfer that failed)", async () => {
    await prefillFailsMidStream("error", "error event");
  });

  it("P's connection resets (the engine crashed)", async () => {
    await prefillFailsMidStream("reset", "reset");
  });

  it(`P's answer takes longer than prefillMs (${PREFILL_MS} ms): a wedged prefill`, async () => {
    await prefillFailsMidStream("hang", "prefillMs exceeded");
  });
});

describe("2. vllm-mooncake: the same concurrent legs, P's JSON answer fails after D's first byte", () => {
  it("P answers 500 once D streams: error event, P blamed", async () => {
    protocol = "vllm-mooncake";
    await rig.putDocument(document());
    try {
      await prefillFailsMidStream("error", "mooncake P 500");
    } finally {
      protocol = "sglang";
      await rig.putDocument(document());
    }
  });
});

describe("2. the failures count: a P that fails every request after D's first byte is ejected", () => {
  it(`ejected once ${EJECT_AFTER} such failures come in a row (health.ejectAfter), not before`, async () => {
    await goodRequest();
    for (let i = 1; i <= EJECT_AFTER; i++) {
      expect((await p0()).healthy).toBe(true);
      await prefillFailsMidStream("reset", `failure ${i} in a row`, false);
    }
    expect((await p0()).healthy).toBe(false);
  });
});
