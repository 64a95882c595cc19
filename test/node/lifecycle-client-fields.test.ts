// Issue 19, item 3, over real TCP against the Worker in workerd: a client's malformed or
// unsupported request never counts against a node. `"stream": true` on a one-hop route made the
// router demand an event stream the engine never sends (vLLM ignores the unknown field and
// answers JSON; SGLang's /tokenize answers 501), so six such calls ejected both decode nodes.
// Every client-controlled field that decides what the router expects of a node's answer is
// checked before anything is sent: a 400 naming it, no upstream request, no failure counted.
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { expectReleased, request, startRig, type Rig } from "./lifecycle-harness";

let rig: Rig;
let doc: any;

beforeAll(async () => {
  rig = await startRig({
    engines: [
      { id: "p0", role: "prefill" },
      { id: "d0", role: "decode" },
      { id: "d1", role: "decode" },
    ],
    document: (url) =>
      (doc = {
        protocol: "vllm",
        policy: { prefill: "round_robin", decode: "round_robin" },
        timeouts: { prefillMs: 3000, decodeFirstByteMs: 3000, decodeIdleMs: 3000, nonStreamMs: 3000 },
        // the default: three failures in a row eject a node
        health: { ejectAfter: 3 },
        nodes: [
          { id: "p0", url: url("p0"), role: "prefill" },
          { id: "d0", url: url("d0"), role: "decode" },
          { id: "d1", url: url("d1"), role: "decode" },
        ],
      }),
  });
}, 120000);

afterAll(async () => {
  await rig?.stop();
});

beforeEach(async () => {
  await rig.reset();
});

const nodes = async () => (await rig.adminStatus()).nodes;
const upstreamRequests = async () => Object.values(await rig.engineStats()).reduce((n, s) => n + s.requests.total, 0);

/** Sends `body` to `path` `times` times: each a 400 naming `param`, nothing upstream, no node failure, every node healthy. */
async function refusedWithoutBlame(path: string, body: unknown, param: string, times = 1) {
  const before = { failures: (await nodes()).map((n) => n.failuresTotal), upstream: await upstreamRequests() };
  for (let i = 0; i < times; i++) {
    const res = await request(rig.url, { path, body });
    expect(res.status, `${path} ${JSON.stringify(body)}: ${res.body}`).toBe(400);
    expect(JSON.parse(res.body).error).toMatchObject({ type: "invalid_request_error", param });
  }
  expect(await upstreamRequests()).toBe(before.upstream);
  const after = await nodes();
  expect(after.map((n) => n.failuresTotal)).toEqual(before.failures);
  expect(after.every((n) => n.healthy)).toBe(true);
}

describe("3. `stream` on a one-hop route (embeddings, tokenizer): refused, never a failure of the node", () => {
  it("six `stream: true` calls on /tokenize, /detokenize and /v1/embeddings eject nothing; the next chat is served without fail-open", async () => {
    await refusedWithoutBlame("/tokenize", { model: "sim-model", prompt: "hello", stream: true }, "stream", 2);
    await refusedWithoutBlame("/detokenize", { model: "sim-model", tokens: [1, 2, 3], stream: true }, "stream", 2);
    await refusedWithoutBlame("/v1/embeddings", { model: "sim-model", input: "hello", stream: true }, "stream", 2);
    const res = await request(rig.url, { body: { model: "sim-model", messages: [{ role: "user", content: "hi" }], max_tokens: 4 } });
    expect(res.status).toBe(200);
    expect(res.headers["x-pd-fail-open"]).toBeUndefined();
    await expectReleased(rig, 2000);
  });

  it("`stream` of another type is refused the same way; `stream: false` is forwarded and answered", async () => {
    await refusedWithoutBlame("/tokenize", { model: "sim-model", prompt: "hello", stream: "true" }, "stream");
    await refusedWithoutBlame("/v1/embeddings", { model: "sim-model", input: "hello", stream: 1 }, "stream");
    const ok = await request(rig.url, { path: "/tokenize", body: { model: "sim-model", prompt: "hello", stream: false } });
    expect(ok.status).toBe(200);
    expect(JSON.parse(ok.body).tokens.length).toBeGreaterThan(0);
  });
});

describe("3. the other fields that decide what the router expects of an answer are checked at the edge", () => {
  // vLLM parses `stream` with pydantic's lax bool ("true", 1 -> true): a router that read only
  // `=== true` would expect JSON from a node that streams, and blame the node
  it.each([
    ["/v1/chat/completions", { model: "sim-model", messages: [{ role: "user", content: "hi" }], stream: "true" }, "stream"],
    ["/v1/completions", { model: "sim-model", prompt: "hi", stream: 1 }, "stream"],
    ["/v1/responses", { model: "sim-model", input: "hi", stream: "yes" }, "stream"],
    // a batch's choices are numbered prompt * n + sample: n must be what the engine reads
    ["/v1/completions", { model: "sim-model", prompt: ["a", "b"], n: "2" }, "n"],
    ["/v1/completions", { model: "sim-model", prompt: ["a", "b"], n: 0 }, "n"],
  ])("%s with %j: 400 naming the field", async (path, body, param) => {
    await refusedWithoutBlame(path, body, param);
  });

  it("SGLang's /generate: `stream` must be a boolean (SGLang streams on any truthy value)", async () => {
    await rig.putDocument({ ...doc, protocol: "sglang" });
    try {
      await refusedWithoutBlame("/generate", { text: "hello", sampling_params: { max_new_tokens: 4 }, stream: "false" }, "stream");
      await refusedWithoutBlame("/generate", { text: "hello", stream: 1 }, "stream");
      const ok = await request(rig.url, { path: "/generate", body: { text: "hello", sampling_params: { max_new_tokens: 4 }, stream: false } });
      expect(ok.status, ok.body).toBe(200);
    } finally {
      await rig.putDocument(doc);
    }
  });
});
