import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { engineErrorOf, ErrorEventGate, HOLD_MAX_BYTES, type EngineError } from "../../src/forward/error-event-gate";

// An engine that fails inside its stream writes an error event, then `data: [DONE]` (vLLM's
// chat_completion/serving.py and SGLang's serving_chat.py, via create_streaming_error_response).
// The gate must find it whatever the chunking and line endings, pass every byte before it
// unchanged, withhold the error event and everything after it, and hold back no more than the
// opening bytes of an event while it decides.

const enc = new TextEncoder();
const dec = new TextDecoder();

/** Feeds `text` in the pieces `cuts` make; what passed, the error reported, and whether the first event settled. */
function gate(text: string, cuts: number[] = [], end = true): { passed: string; error: EngineError | null; errors: number; settled: boolean } {
  const g = new ErrorEventGate();
  const bytes = enc.encode(text);
  const out: Uint8Array[] = [];
  let error: EngineError | null = null;
  let errors = 0;
  const take = (r: { pass: Uint8Array; error: EngineError | null }) => {
    out.push(r.pass);
    if (r.error) {
      error = r.error;
      errors++;
    }
  };
  let at = 0;
  for (const c of [...new Set(cuts.filter((x) => x > 0 && x < bytes.length))].sort((a, b) => a - b)) {
    take(g.feed(bytes.subarray(at, c)));
    at = c;
  }
  take(g.feed(bytes.subarray(at)));
  if (end) take(g.end());
  const all = new Uint8Array(out.reduce((n, p) => n + p.byteLength, 0));
  let k = 0;
  for (const p of out) {
    all.set(p, k);
    k += p.byteLength;
  }
  return { passed: dec.decode(all), error, errors, settled: g.firstSettled };
}

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

describe("ErrorEventGate: a stream without an error event passes whole", () => {
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
    const g = new ErrorEventGate();
    const big = `data: ${JSON.stringify(chunk("x".repeat(100_000)))}\n\n`;
    const bytes = enc.encode(big);
    const first = g.feed(bytes.subarray(0, 10));
    expect(first.pass.byteLength).toBe(0);
    const second = g.feed(bytes.subarray(10, 50_000));
    expect(second.pass.byteLength).toBe(50_000);
    // a long comment before the data is held only up to HOLD_MAX_BYTES
    const h = new ErrorEventGate();
    const comment = `: ${"k".repeat(3 * HOLD_MAX_BYTES)}\n`;
    expect(h.feed(enc.encode(comment)).pass.byteLength).toBe(enc.encode(comment).byteLength);
    expect(h.firstSettled).toBe(false);
  });

  it("a stream cut inside an event gives back what it held (the completeness check judges it)", () => {
    const text = `data: ${JSON.stringify(chunk("a"))}\n\ndata: {"id"`;
    expect(gate(text).passed).toBe(text);
  });
});

describe("ErrorEventGate: an error event is found and cut out, with what follows", () => {
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
          const error = r.error as unknown as EngineError;
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
    const r = gate(`data: ${long}\n\n`, [], false);
    expect(r.passed).toBe("");
    expect(r.error?.status).toBe(500);
    expect(r.error?.message.length).toBeLessThanOrEqual(303);
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
