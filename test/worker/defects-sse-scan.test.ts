import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { CompletenessJudge, JsonTypeScan, SseScanner, type SseEventInfo } from "../../src/forward/sse-scan";

// Issue 19 item 5: whether a stream that ended cleanly was complete is decided on its parsed SSE
// events — incrementally, in constant memory, whatever the chunking, the line endings, the
// framing (`event:` lines or `data:`-only with a "type") and the size of the final event.

const enc = new TextEncoder();
const END_TYPES = ["response.completed", "response.incomplete", "response.failed"];

/** Feeds `text` to a fresh scanner in the pieces `cuts` make; returns the events it reported. */
function scan(text: string, cuts: number[], typed = true, end = true): SseEventInfo[] {
  const events: SseEventInfo[] = [];
  const s = new SseScanner((e) => events.push(e), typed);
  const bytes = enc.encode(text);
  let at = 0;
  for (const c of [...cuts.filter((x) => x > 0 && x < bytes.length)].sort((a, b) => a - b)) {
    s.feed(bytes.subarray(at, c));
    at = c;
  }
  s.feed(bytes.subarray(at));
  if (end) s.end();
  return events;
}

function judge(rule: ConstructorParameters<typeof CompletenessJudge>[0], text: string, cuts: number[] = []): boolean {
  const j = new CompletenessJudge(rule);
  const bytes = enc.encode(text);
  let at = 0;
  for (const c of [...cuts.filter((x) => x > 0 && x < bytes.length)].sort((a, b) => a - b)) {
    j.feed(bytes.subarray(at, c));
    at = c;
  }
  j.feed(bytes.subarray(at));
  return j.end();
}

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

describe("SseScanner: the same events whatever the chunking", () => {
  it("reports each event's type, in both framings, with any line ending", () => {
    fc.assert(
      fc.property(events, framing, eol, cuts, (evs, f, e, c) => {
        const text = evs.map((x) => frame(x, f, e)).join("");
        expect(scan(text, c).map((x) => x.type)).toEqual(evs.map((x) => x.type));
      }),
    );
  });

  it("an `event:` line wins over the data's type; comments, ids and unknown fields are ignored", () => {
    const text = ': ping\nid: 7\nretry: 10\nevent: a\ndata: {"type":"b"}\n\ndata: {"type":"c"}\nfoo: bar\n\n:\n\n';
    expect(scan(text, [])).toEqual([
      { type: "a", done: false },
      { type: "c", done: false },
    ]);
  });

  it("a data-only event's type counts only when its JSON object is complete and the type is top-level", () => {
    expect(scan('data: {"type":"x"\n\n', []).map((e) => e.type)).toEqual([null]);
    expect(scan('data: {"a":{"type":"x"}}\n\n', []).map((e) => e.type)).toEqual([null]);
    expect(scan('data: {"a":{"type":"x"},"type":"y"}\n\n', []).map((e) => e.type)).toEqual(["y"]);
    expect(scan('data: {"a":"\\"type\\":\\"x\\"","type" : "z"}\n\n', []).map((e) => e.type)).toEqual(["z"]);
    // multi-line data joins with a newline: still one JSON object
    expect(scan('data: {"type":\ndata: "w"}\n\n', []).map((e) => e.type)).toEqual(["w"]);
    expect(scan('data: ["type","x"]\n\n', []).map((e) => e.type)).toEqual([null]);
    expect(scan('data: {"type":"x"} trailing\n\n', []).map((e) => e.type)).toEqual([null]);
  });

  it("an event not closed by a blank line is no event (a client's parser drops it too)", () => {
    expect(scan('event: response.completed\ndata: {"type":"response.completed"}\n', [])).toEqual([]);
    expect(scan('data: {"type":"response.completed"}', [])).toEqual([]);
  });
});

describe("CompletenessJudge: complete streams pass, cut ones fail", () => {
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
        const bytes = enc.encode(text).subarray(0, cut);
        expect(judge({ kind: "events", types: END_TYPES }, new TextDecoder().decode(bytes), c)).toBe(false);
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

  it("a line that never ends (48 MB of one data line) is read through, never held, and judged incomplete", () => {
    const j = new CompletenessJudge({ kind: "events", types: END_TYPES });
    const piece = enc.encode(`data: {"type":"x","pad":"${"x".repeat(1 << 20)}`);
    const more = enc.encode("x".repeat(1 << 20));
    j.feed(piece);
    for (let i = 0; i < 47; i++) j.feed(more);
    expect(j.end()).toBe(false);
  });
});

describe("JsonTypeScan", () => {
  it("agrees with JSON.parse on the top-level string `type` of any complete object", () => {
    fc.assert(
      fc.property(fc.dictionary(fc.constantFrom("type", "a", "ty", "types", "x"), fc.jsonValue({ maxDepth: 3 })), (obj) => {
        const s = new JsonTypeScan();
        for (const b of enc.encode(JSON.stringify(obj))) s.byte(b);
        const t = (obj as { type?: unknown }).type;
        // JSON.stringify escapes quotes, backslashes and control characters: an escaped value is never taken
        const plain = typeof t === "string" && JSON.stringify(t) === `"${t}"` && enc.encode(t).length <= 128;
        expect(s.result()).toBe(plain ? t : null);
      }),
    );
  });
});
