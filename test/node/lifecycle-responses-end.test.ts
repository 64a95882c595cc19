// Issue 19, item 5, over real TCP against the Worker in workerd: whether a Responses API stream
// that ended cleanly was complete is decided on its parsed SSE events, in both framings servers
// use — vLLM's `event: <type>` + `data:` (vllm entrypoints/openai/responses/api_router.py
// `_convert_stream_to_sse_events`) and `data:`-only events whose JSON carries its `"type"` —
// however the bytes are chunked and however large the final event is. A complete stream passes
// as D sent it; a stream cut before its final event ends with `upstream_stream_incomplete`,
// even when the last delta's text contains the final event's name.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RawClient, expectReleased, sleep, startRig, until, type Rig } from "./lifecycle-harness";
import { sseHead, startScriptedEngine, type ScriptedEngine } from "./scripted-engine";

type Framing = "event-lines" | "data-only";
/** what the scripted D streams for the next request */
let script: { framing: Framing; finalChars: number; cut: "none" | "after-marker-delta" | "inside-final" } = { framing: "event-lines", finalChars: 0, cut: "none" };

const created = { id: "resp_scripted1", object: "response", status: "in_progress", output: [] };
const MARKER_DELTA = 'the stream ends with "type":"response.completed" (event: response.completed)';

function eventText(framing: Framing, type: string, fields: Record<string, unknown>, seq: number): string {
  if (framing === "event-lines") return `event: ${type}\ndata: ${JSON.stringify({ ...fields, sequence_number: seq, type })}\n\n`;
  return `data: ${JSON.stringify({ type, ...fields, sequence_number: seq })}\n\n`;
}

let rig: Rig;
let d: ScriptedEngine;
/** every byte the scripted D wrote for the last request */
let sent = "";

beforeAll(async () => {
  d = await startScriptedEngine(async (req, res) => {
    if (!req.body) return void res.end('{"object":"list","data":[]}');
    const { framing, finalChars, cut } = script;
    sseHead(res);
    sent = "";
    const write = (text: string) => {
      sent += text;
      res.write(text);
    };
    const deltas = ["Hello", " there", cut === "after-marker-delta" ? MARKER_DELTA : " friend"];
    let seq = 0;
    write(eventText(framing, "response.created", { response: created }, seq++));
    for (const delta of deltas) write(eventText(framing, "response.output_text.delta", { item_id: "msg_1", output_index: 0, content_index: 0, delta }, seq++));
    if (cut === "after-marker-delta") return void res.end();
    const text = deltas.join("") + "y".repeat(finalChars);
    const final = eventText(
      framing,
      "response.completed",
      {
        response: {
          ...created,
          status: "completed",
          output: [{ type: "message", id: "msg_1", content: [{ type: "output_text", text }] }],
          usage: { input_tokens: 3, output_tokens: 3, total_tokens: 6 },
        },
      },
      seq++,
    );
    const end = cut === "inside-final" ? Math.floor(final.length / 2) : final.length;
    // the final event in 4 KB pieces, so every chunk boundary of the router's reads is exercised
    for (let at = 0; at < end; at += 4096) {
      write(final.slice(at, Math.min(end, at + 4096)));
      await sleep(1);
    }
    res.end();
  });
  rig = await startRig({
    engines: [],
    vars: { CLIENT_STALL_MS: 2000 },
    document: () => ({
      protocol: "colocated",
      timeouts: { prefillMs: 3000, decodeFirstByteMs: 3000, decodeIdleMs: 3000, nonStreamMs: 3000 },
      health: { ejectAfter: 100 },
      nodes: [{ id: "d0", url: d.url, role: "both" }],
    }),
  });
}, 120000);

afterAll(async () => {
  await rig?.stop();
  await d?.close();
});

let seq = 0;
async function stream(s: typeof script): Promise<{ body: string; log: Record<string, unknown> }> {
  script = s;
  const id = `lcr-${s.framing}-${s.cut}-${seq++}`;
  const client = new RawClient(rig.port, { path: "/v1/responses", body: { model: "sim-model", input: "hi", stream: true }, headers: { "x-request-id": id } });
  expect(await client.waitEnded(10000)).toBe(true);
  const { status, body } = client.response();
  expect(status).toBe(200);
  await until(
    "log line",
    async () => rig.requestLogs(id).length,
    (n) => n > 0,
    3000,
  );
  await expectReleased(rig, 2000);
  return { body, log: rig.requestLogs(id)[0]! };
}

describe("5. a Responses stream is judged complete on its events, not its last bytes", () => {
  it.each(["event-lines", "data-only"] as const)("%s framing, complete, with a 300 KB final event: passed on unchanged, logged 200", async (framing) => {
    const { body, log } = await stream({ framing, finalChars: 300_000, cut: "none" });
    expect(sent.length).toBeGreaterThan(300_000);
    // byte for byte what D sent: nothing added (no error event), nothing lost, nothing re-framed
    expect(body === sent, `the client got ${body.length} chars, D sent ${sent.length}`).toBe(true);
    expect(log).toMatchObject({ status: 200, outcome: "ok" });
  });

  it.each(["event-lines", "data-only"] as const)("%s framing, cut after a delta whose text names the final event: incomplete, logged 502", async (framing) => {
    const { body, log } = await stream({ framing, finalChars: 0, cut: "after-marker-delta" });
    expect(body).toContain(MARKER_DELTA.replace(/"/g, '\\"'));
    expect(body).toContain("event: error");
    expect(body).toContain('"code":"upstream_stream_incomplete"');
    expect(log).toMatchObject({ status: 502, outcome: "error" });
  });

  it.each(["event-lines", "data-only"] as const)("%s framing, cut inside its final event (its JSON half sent): incomplete", async (framing) => {
    const { body, log } = await stream({ framing, finalChars: 20_000, cut: "inside-final" });
    expect(body).toContain('"code":"upstream_stream_incomplete"');
    expect(log).toMatchObject({ status: 502, outcome: "error" });
  });
});
