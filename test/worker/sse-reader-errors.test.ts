import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { engineErrorOf } from "../../src/forward/engine-error";
import { HOLD_MAX_BYTES, sseReader } from "../../src/forward/sse-reader";
import { feedReader } from "../support/sse-feed";
import { withoutFileEngines } from "./helpers";

withoutFileEngines();

// An engine that fails inside its stream writes an error event, then `data: [DONE]` (vLLM's
// chat_completion/serving.py and SGLang's serving_chat.py, via create_streaming_error_response).
// The reader must find it whatever the chunking and line endings, pass every byte before it
// unchanged, withhold the error event and everything after it, and hold back no more than the
// opening bytes of an event while it decides.

const enc = new TextEncoder();

/** Feeds `text` in the pieces `cuts` make; what passed, the error reported, and whether the first event settled. */
const gate = (text: string, cuts: number[] = [], end = true) => {
  const r = feedReader(text, cuts, { kind: "done" }, null, end);
  return { passed: r.out, error: r.error, errors: r.errors, settled: r.settled };
};

const chunk = (text: string) => ({ id: "chatcmpl-1", object: "chat.completion.chunk", choices: [{ index: 0, delta: { content: text }, finish_reason: null }] });
/** the error data each engine writes (vllm, older vllm, sglang, sglang /generate, a Responses error event's) */
const ERRORS = {
  vllm: { error: { message: "Internal server error", type: "InternalServerError", param: null, code: 500 } },
  vllmOld: { error: { object: "error", message: "prompt too long", type: "BadRequestError", param: null, code: 400 } },
  sglang: { error: { object: "error", message: "KVTransferError(bootstrap_room=7): Aborted by AbortReq.", type: "INTERNAL_SERVER_ERROR", param: null, code: 500 } },
  generate: { error: { message: "The input (9000 tokens) is longer than the model's context length (8192 tokens)." } },
};
const tokenText = fc.oneof(fc.string(), fc.constantFrom('{"error": {"message": "x"}}', "data: [DONE]", "\\n\\n", "event: error", "ü€😀"));
const eol = fc.constantFrom("\n", "\r\n", "\r");
const cuts = fc.array(fc.nat({ max: 3000 }), { maxLength: 14 });
const plainEvents = (texts: string[], e: string) => texts.map((t) => `data: ${JSON.stringify(chunk(t))}${e}${e}`).join("");

describe("error events: a stream without one passes whole", () => {
  it("every byte passes, in order, whatever the chunking and line endings; the first event settles", () => {
    fc.assert(
      fc.property(fc.array(tokenText, { minLength: 1, maxLength: 8 }), eol, cuts, (texts, e, c) => {
        const text = `${plainEvents(texts, e)}data: [DONE]${e}${e}`;
        const r = gate(text, c);
        expect(r.passed).toBe(text);
        expect(r.error).toBeNull();
        expect(r.settled).toBe(true);
      }),
    );
  });

  it("a Responses stream (event lines, and data-only with a type) passes whole", () => {
    const events = ["response.created", "response.output_text.delta", "response.completed"];
    const framed = [
      events.map((t) => `event: ${t}\ndata: ${JSON.stringify({ type: t, delta: "error" })}\n\n`).join(""),
      events.map((t) => `data: ${JSON.stringify({ type: t, response: { error: null } })}\n\n`).join(""),
    ];
    for (const text of framed) expect(gate(text, [3, 17, 40])).toMatchObject({ passed: text, error: null, settled: true });
  });

  it("a large event is not held back whole: past the opening bytes it flows as it comes", () => {
    const g = sseReader({ kind: "done" });
    const big = `data: ${JSON.stringify(chunk("x".repeat(100_000)))}\n\n`;
    const bytes = enc.encode(big);
    const first = g.feed(bytes.subarray(0, 10));
    expect(first.pass.byteLength).toBe(0);
    const second = g.feed(bytes.subarray(10, 50_000));
    expect(second.pass.byteLength).toBe(50_000);
    // a long comment before the data is held only up to HOLD_MAX_BYTES
    const h = sseReader({ kind: "done" });
    const comment = `: ${"k".repeat(3 * HOLD_MAX_BYTES)}\n`;
    expect(h.feed(enc.encode(comment)).pass.byteLength).toBe(enc.encode(comment).byteLength);
    expect(h.settled).toBe(false);
  });

  it("a stream cut inside an event gives back what it held (the completeness check judges it)", () => {
    const text = `data: ${JSON.stringify(chunk("a"))}\n\ndata: {"id"`;
    expect(gate(text).passed).toBe(text);
  });
});

describe("error events: one is found and cut out, with what follows", () => {
  it("every engine's error frame after k events: exactly the k events pass; the error reported once, with its status and message", () => {
    fc.assert(
      fc.property(
        fc.array(tokenText, { maxLength: 5 }),
        fc.constantFrom(...(Object.keys(ERRORS) as Array<keyof typeof ERRORS>)),
        eol,
        fc.boolean(),
        cuts,
        (texts, engine, e, done, c) => {
          const before = plainEvents(texts, e);
          // vLLM writes json.dumps (", " and ": "); SGLang's /generate orjson (no blanks)
          const data = engine === "generate" ? JSON.stringify(ERRORS[engine]) : JSON.stringify(ERRORS[engine], null, 1).replace(/\n\s*/g, " ");
          const text = `${before}data: ${data}${e}${e}${done ? `data: [DONE]${e}${e}` : ""}`;
          const r = gate(text, c);
          expect(r.passed).toBe(before);
          expect(r.errors).toBe(1);
          const error = r.error!;
          expect(error.first).toBe(texts.length === 0);
          expect(error.message).toBe((ERRORS[engine].error as { message: string }).message);
          expect(error.status).toBe((ERRORS[engine].error as { code?: number }).code ?? null);
        },
      ),
    );
  });

  it("the Responses API's error event (event: error, or data-only type error) is found too", () => {
    const delta = `event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"hi"}\n\n`;
    for (const err of [
      `event: error\ndata: {"type":"error","code":"500","message":"boom","param":null,"sequence_number":3}\n\n`,
      `data: {"type": "error", "code": 500, "message": "boom"}\n\n`,
    ]) {
      const r = gate(`${delta}${err}`, [5, delta.length + 3]);
      expect(r.passed).toBe(delta);
      expect(r.error).toEqual({ message: "boom", status: 500, first: false });
    }
  });

  it("a keep-alive comment before the error does not make it a later event: it is still the first", () => {
    const r = gate(`: ping\n\ndata: ${JSON.stringify(ERRORS.sglang)}\n\ndata: [DONE]\n\n`);
    expect(r.passed).toBe(": ping\n\n");
    expect(r.error?.first).toBe(true);
    expect(r.settled).toBe(false);
  });

  it("an error event whose data is far longer than what is read for its message: reported, nothing of it passes", () => {
    const long = JSON.stringify({ error: { message: "m".repeat(20_000), code: 500 } });
    // the code comes last (vLLM): read from the data's tail, whatever the chunking
    for (const cuts of [[], [10], [70, 5000, 9000], [20_030]]) {
      const r = gate(`data: ${long}\n\n`, cuts, false);
      expect(r.passed).toBe("");
      expect(r.error?.status).toBe(500);
      expect(r.error?.message).toMatch(/^m{300}\.\.\.$/);
    }
    // a line that never ends: reported once 64 KB of it were read, from its head
    const endless = gate(`data: {"error": {"message": "${"m".repeat(1 << 17)}`, [100, 70_000]);
    expect(endless).toMatchObject({ passed: "", errors: 1 });
  });

  it("an error event cut short by the stream's end is reported at the end", () => {
    const r = gate(`data: {"error": {"message": "half`, []);
    expect(r.passed).toBe("");
    expect(r.error).toEqual({ message: "the engine reported an error", status: null, first: true });
  });
});

describe("engineErrorOf", () => {
  it("reads message and status from each engine's error data, whole or cut", () => {
    expect(engineErrorOf(JSON.stringify(ERRORS.vllm))).toEqual({ message: "Internal server error", status: 500 });
    expect(engineErrorOf(JSON.stringify(ERRORS.generate))).toEqual({ message: ERRORS.generate.error.message, status: null });
    expect(engineErrorOf('{"error": "plain text"}')).toEqual({ message: "plain text", status: null });
    expect(engineErrorOf('{"error": {"message": "cut \\"here\\"", "code": 503, "x": "')).toEqual({ message: 'cut "here"', status: 503 });
    expect(engineErrorOf('{"error": {"message": "odd", "code": 42}}')).toEqual({ message: "odd", status: null });
  });
});
