import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { jsonTypeScan, sseReader, type Completeness } from "../../src/forward/sse-reader";
import { feedReader } from "../support/sse-feed";
import { withoutFileEngines } from "./helpers";

withoutFileEngines();

// Issue 19 item 5: whether a stream that ended cleanly was complete is decided on its parsed SSE
// events — incrementally, in constant memory, whatever the chunking, the line endings, the
// framing (`event:` lines or `data:`-only with a "type") and the size of the final event.

const enc = new TextEncoder();
const END_TYPES = ["response.completed", "response.incomplete", "response.failed"];
const TYPES = ["response.created", "response.output_text.delta", "response.in_progress"];

/** Whether the stream in `text`, fed in the pieces `cuts` make, counts as complete under `rule`. */
function judge(rule: Completeness, text: string, cuts: number[] = []): boolean {
  return feedReader(text, cuts, rule).complete;
}
/** Whether an event of `type` is among the stream's events (an event's type: its `event:` line, else its data's top-level "type"). */
const hasEvent = (type: string, text: string, cuts: number[] = []) => judge({ kind: "events", types: [type] }, text, cuts);

type Ev = { type: string; payload: Record<string, unknown> };
const deltaText = fc.oneof(fc.string(), fc.constantFrom("response.completed", '"type":"response.completed"', "event: response.completed", "data: [DONE]", "\\n\\n", "ü€😀"));
const events = fc.array(
  fc.record({ type: fc.constantFrom("response.created", "response.output_text.delta", "response.in_progress"), payload: fc.record({ delta: deltaText, n: fc.integer() }) }),
  { maxLength: 8 },
);

/** One event in a framing: vLLM's `event:` + `data:` (type last in the JSON), or `data:` only with the type first. */
function frame(e: Ev, framing: "event-lines" | "data-only", eol: string): string {
  return framing === "event-lines"
    ? `event: ${e.type}${eol}data: ${JSON.stringify({ ...e.payload, type: e.type })}${eol}${eol}`
    : `data: ${JSON.stringify({ type: e.type, ...e.payload })}${eol}${eol}`;
}

const framing = fc.constantFrom("event-lines" as const, "data-only" as const);
const eol = fc.constantFrom("\n", "\r\n", "\r");
const cuts = fc.array(fc.nat({ max: 400_000 }), { maxLength: 12 });

describe("sseReader: each event's type, whatever the chunking", () => {
  it("finds every event's type, in both framings, with any line ending, and no other", () => {
    fc.assert(
      fc.property(events, framing, eol, cuts, (evs, f, e, c) => {
        const text = evs.map((x) => frame(x, f, e)).join("");
        for (const t of TYPES) expect(hasEvent(t, text, c)).toBe(evs.some((x) => x.type === t));
      }),
    );
  });

  it("an `event:` line wins over the data's type; comments, ids and unknown fields are ignored", () => {
    const text = ': ping\nid: 7\nretry: 10\nevent: a\ndata: {"type":"b"}\n\ndata: {"type":"c"}\nfoo: bar\n\n:\n\n';
    expect(["a", "b", "c", "ping", "7", "bar"].filter((t) => hasEvent(t, text))).toEqual(["a", "c"]);
  });

  it("a data-only event's type counts only when its JSON object is complete and the type is top-level", () => {
    expect(hasEvent("x", 'data: {"type":"x"\n\n')).toBe(false);
    expect(hasEvent("x", 'data: {"a":{"type":"x"}}\n\n')).toBe(false);
    expect(hasEvent("y", 'data: {"a":{"type":"x"},"type":"y"}\n\n')).toBe(true);
    expect(hasEvent("x", 'data: {"a":{"type":"x"},"type":"y"}\n\n')).toBe(false);
    expect(hasEvent("z", 'data: {"a":"\\"type\\":\\"x\\"","type" : "z"}\n\n')).toBe(true);
    expect(hasEvent("x", 'data: {"a":"\\"type\\":\\"x\\"","type" : "z"}\n\n')).toBe(false);
    // multi-line data joins with a newline: still one JSON object
    expect(hasEvent("w", 'data: {"type":\ndata: "w"}\n\n')).toBe(true);
    expect(hasEvent("x", 'data: ["type","x"]\n\n')).toBe(false);
    expect(hasEvent("x", 'data: {"type":"x"} trailing\n\n')).toBe(false);
    expect(hasEvent("x", 'data: {"type":"x"}   \n\n')).toBe(true);
  });

  it("an event not closed by a blank line is no event (a client's parser drops it too)", () => {
    expect(hasEvent("response.completed", 'event: response.completed\ndata: {"type":"response.completed"}\n')).toBe(false);
    expect(hasEvent("response.completed", 'data: {"type":"response.completed"}')).toBe(false);
  });
});

describe("completeness: complete streams pass, cut ones fail", () => {
  const final = (chars: number): Ev => ({ type: "response.completed", payload: { response: { id: "resp_1", output: [{ text: "y".repeat(chars) }] } } });

  it("a Responses stream ending with its final event is complete, whatever its size and chunking", () => {
    fc.assert(
      fc.property(events, framing, eol, fc.nat({ max: 300_000 }), cuts, (evs, f, e, size, c) => {
        const text = [...evs, final(size)].map((x) => frame(x, f, e)).join("");
        expect(judge({ kind: "events", types: END_TYPES }, text, c)).toBe(true);
      }),
      { numRuns: 60 },
    );
  });

  it("the same stream cut at any byte before its final event's blank line is incomplete — deltas naming the final event included", () => {
    fc.assert(
      fc.property(events, framing, fc.nat({ max: 2000 }), fc.double({ min: 0, max: 1, noNaN: true }), cuts, (evs, f, size, where, c) => {
        const head = evs.map((x) => frame(x, f, "\n")).join("");
        const text = head + frame(final(size), f, "\n");
        // every cut from the first byte up to (not including) the final blank line's LF
        const cut = Math.floor(where * (enc.encode(text).length - 1));
        expect(feedReader(enc.encode(text).subarray(0, cut), c, { kind: "events", types: END_TYPES }).complete).toBe(false);
      }),
      { numRuns: 200 },
    );
  });

  it("chat and completions: complete once `data: [DONE]` came (its final newlines may be missing), never from text that only contains it", () => {
    const rule = { kind: "done" } as const;
    expect(judge(rule, 'data: {"choices":[]}\n\ndata: [DONE]\n\n')).toBe(true);
    expect(judge(rule, 'data: {"choices":[]}\n\ndata: [DONE]')).toBe(true);
    expect(judge(rule, "data:[DONE]\r\n\r\n", [3, 7])).toBe(true);
    expect(judge(rule, 'data: {"choices":[{"text":"data: [DONE]"}]}\n\n')).toBe(false);
    expect(judge(rule, "data: [DON")).toBe(false);
    expect(judge(rule, 'data: {"choices":[]}\n\n')).toBe(false);
  });

  it("a line that never ends (48 MB of one data line) is read through, passed as it comes, and judged incomplete", () => {
    const reader = sseReader({ kind: "events", types: END_TYPES });
    const piece = enc.encode(`data: {"type":"x","pad":"${"x".repeat(1 << 20)}`);
    const more = enc.encode("x".repeat(1 << 20));
    // past the bytes that tell it is no error event, every chunk goes on whole, as the same bytes
    expect(reader.feed(piece).pass.byteLength).toBe(piece.byteLength);
    for (let i = 0; i < 47; i++) {
      const pass = reader.feed(more).pass;
      expect(pass.buffer === more.buffer && pass.byteLength === more.byteLength).toBe(true);
    }
    expect(reader.end().pass.byteLength).toBe(0);
    expect(reader.complete).toBe(false);
  });
});

describe("jsonTypeScan", () => {
  it("agrees with JSON.parse on the top-level string `type` of any complete object", () => {
    fc.assert(
      fc.property(fc.dictionary(fc.constantFrom("type", "a", "ty", "types", "x"), fc.jsonValue({ maxDepth: 3 })), (obj) => {
        const s = jsonTypeScan();
        for (const b of enc.encode(JSON.stringify(obj))) s.byte(b);
        const t = (obj as { type?: unknown }).type;
        // JSON.stringify escapes quotes, backslashes and control characters: an escaped value is never taken
        const plain = typeof t === "string" && JSON.stringify(t) === `"${t}"` && enc.encode(t).length <= 128;
        expect(s.result()).toBe(plain ? t : null);
      }),
    );
  });
});
