// A batched streaming /v1/completions merges each prompt's decode stream as the one SSE reader
// (src/forward/sse-reader.ts) passes it: choices renumbered line by line, whatever line endings
// the decode server writes (the SSE spec allows LF, CR and CRLF; some servers behind a proxy
// write CRLF), usage summed into one frame, one [DONE]; a data line too long to renumber ends
// the batch with an error, counted against no node. Over real TCP against the Worker in workerd,
// with a scripted decode server whose framing each prompt chooses.
import { createParser } from "eventsource-parser";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { MAX_DATA_LINE_BYTES } from "../../src/forward/sse-reader";
import { RawClient, expectReleased, sleep, startRig, until, type Rig } from "./lifecycle-harness";
import { startScriptedEngine, sseHead, writeDrained, type ScriptedEngine } from "./scripted-engine";

const TIMEOUTS = { prefillMs: 3000, decodeFirstByteMs: 3000, decodeIdleMs: 2000, nonStreamMs: 3000 };
/** what the scripted D reports as its prompt tokens: the router must show P's counts instead */
const D_PROMPT_TOKENS = 999;

let rig: Rig;
let d: ScriptedEngine;

beforeAll(async () => {
  // Each prompt's answer: three text chunks, D's usage frame, [DONE], in the framing its prompt names.
  d = await startScriptedEngine(async (req, res) => {
    const prompt = String(req.json.prompt);
    const eol = prompt.startsWith("crlf") ? "\r\n" : prompt.startsWith("cr ") ? "\r" : "\n";
    const event = (json: unknown) => `data: ${JSON.stringify(json)}${eol}${eol}`;
    const chunk = (text: string) => ({
      id: "cmpl-s",
      object: "text_completion",
      created: 0,
      model: "sim-model",
      choices: [{ index: 0, text, logprobs: null, finish_reason: null }],
    });
    sseHead(res);
    for (const word of ["one ", "two ", "three"]) if (!(await writeDrained(res, event(chunk(`${prompt.slice(0, 6)}:${word}`))))) return;
    // a line too long to renumber, then what a complete answer ends with
    if (prompt.startsWith("huge")) await writeDrained(res, event(chunk("z".repeat(MAX_DATA_LINE_BYTES + 1000))));
    await writeDrained(
      res,
      event({
        id: "cmpl-s",
        object: "text_completion",
        created: 0,
        model: "sim-model",
        choices: [],
        usage: { prompt_tokens: D_PROMPT_TOKENS, completion_tokens: 3, total_tokens: D_PROMPT_TOKENS + 3 },
      }),
    );
    res.end(`data: [DONE]${eol}${eol}`);
  });
  rig = await startRig({
    engines: [{ id: "p0", role: "prefill" }],
    vars: { LEASE_TTL_MS: 3000, CLIENT_STALL_MS: 1000 },
    document: (url) => ({
      protocol: "vllm",
      timeouts: TIMEOUTS,
      health: { ejectAfter: 100 },
      nodes: [
        { id: "p0", url: url("p0"), role: "prefill" },
        { id: "d0", url: d.url, role: "decode" },
      ],
    }),
  });
}, 120000);

afterAll(async () => {
  await rig?.stop();
  await d?.close();
});

beforeEach(async () => {
  await rig.reset();
});

let seq = 0;
const newId = (what: string) => `bm-${what}-${Date.now().toString(36)}-${seq++}`;

/** The data of every event a client's SSE parser reads from the body. */
function clientData(body: string): string[] {
  const data: string[] = [];
  const parser = createParser({ onEvent: (e) => data.push(e.data) });
  parser.feed(body);
  return data;
}

async function batch(id: string, prompts: string[]): Promise<string> {
  const body = { model: "sim-model", prompt: prompts, max_tokens: 3, stream: true, stream_options: { include_usage: true } };
  const client = new RawClient(rig.port, { path: "/v1/completions", body, headers: { "x-request-id": id } });
  expect(await client.waitEnded(10000)).toBe(true);
  const res = client.response();
  expect(res.status).toBe(200);
  return res.body;
}

describe("a batched stream is merged event by event, in any SSE framing", () => {
  it("prompts answered with LF, CRLF and CR line endings: each choice under its prompt's index, one usage frame with P's counts, one [DONE]", async () => {
    const prompts = ["lf the first prompt", "crlf the second prompt", "cr the third prompt"];
    const data = clientData(await batch(newId("framing"), prompts));
    expect(data.filter((x) => x === "[DONE]")).toHaveLength(1);
    expect(data.at(-1)).toBe("[DONE]");
    const events = data.filter((x) => x !== "[DONE]").map((x) => JSON.parse(x));
    for (const [i, prompt] of prompts.entries()) {
      const text = events
        .flatMap((e) => e.choices)
        .filter((c) => c.index === i)
        .map((c) => c.text)
        .join("");
      expect(text).toBe(["one ", "two ", "three"].map((w) => `${prompt.slice(0, 6)}:${w}`).join(""));
    }
    const usage = events.filter((e) => e.usage);
    expect(usage).toHaveLength(1);
    expect(usage[0].choices).toEqual([]);
    expect(usage[0].usage.completion_tokens).toBe(9);
    // each prompt's usage shows P's prompt tokens (the simulator counts a token per 4 characters), not D's
    expect(usage[0].usage.prompt_tokens).toBe(prompts.reduce((n, p) => n + Math.ceil(p.length / 4), 0));
    await expectReleased(rig, 2000);
  });

  it(`a prompt whose D sends an event over ${MAX_DATA_LINE_BYTES} bytes: the batch ends with an error event, never [DONE]; no node is counted`, async () => {
    const id = newId("huge");
    const before = (await rig.adminStatus()).nodes.find((x) => x.id === "d0")!.failuresTotal;
    const body = await batch(id, ["lf a small prompt", "huge a prompt whose answer cannot be renumbered", "crlf another small prompt"]);
    expect(body).toContain("event: error");
    expect(body).toContain("batch_event_too_large");
    expect(body).not.toContain("[DONE]");
    // nothing of the long line reached the client
    expect(body).not.toContain("z".repeat(1000));
    await expectReleased(rig, 2000);
    const ids = [0, 1, 2].map((i) => `${id}/${i}`);
    await until(
      "a log line a prompt",
      async () => ids.filter((x) => rig.requestLogs(x).length > 0).length,
      (n) => n === 3,
      2000,
    );
    await sleep(200);
    const logs = ids.map((x) => rig.requestLogs(x));
    for (const l of logs) expect(l).toHaveLength(1);
    expect(logs[1]![0]).toMatchObject({ status: 502, outcome: "error" });
    expect(String(logs[1]![0]!.error)).toContain(`over ${MAX_DATA_LINE_BYTES} bytes`);
    // the others had ended (their whole answer read) or were ended with the batch
    for (const k of [0, 2]) {
      const line = logs[k]![0]!;
      if (line.status !== 200) expect(String(line.error)).toContain("another prompt of the batch failed");
    }
    // the decode node did nothing wrong: a batch cannot carry what a single stream would
    expect((await rig.adminStatus()).nodes.find((x) => x.id === "d0")!.failuresTotal).toBe(before);
  });
});
