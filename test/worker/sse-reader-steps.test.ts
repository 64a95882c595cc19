import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { sseFraming, type Field } from "../../src/forward/sse-framing";
import { completesStream, jsonTypeScan, rewriteDataLine } from "../../src/forward/sse-reader";

// The SSE reader's steps, each alone (issue 26): framing (lines and fields), usage (a held data
// line rewritten) and completeness (an event that ends the stream). The reader that composes
// them, and the events step between, are held to their promise in sse-reader*.test.ts.

const enc = new TextEncoder();
const dec = new TextDecoder();

type Line = { field: Field; value: string } | "blank";

/** What the framing reports for `text` fed in the pieces `cuts` make: each line's field and value, and the blank lines. */
function frameLines(text: string, cuts: number[] = []): Line[] {
  const bytes = enc.encode(text);
  const lines: Line[] = [];
  let field: Field | null = null;
  let value: number[] = [];
  const framing = sseFraming({
    lineStart: () => {
      field = null;
      value = [];
    },
    field: (f) => {
      field = f;
    },
    value: (chunk, from, to) => {
      value.push(...chunk.subarray(from, to));
      return to;
    },
    lineEnd: (_at, unnamed) => lines.push({ field: unnamed ?? field!, value: dec.decode(new Uint8Array(value)) }),
    blank: () => lines.push("blank"),
  });
  const at = [...new Set(cuts.map((c) => c % (bytes.length + 1)))].sort((a, b) => a - b);
  let start = 0;
  for (const end of [...at, bytes.length]) {
    framing.feed(bytes.subarray(start, end));
    start = end;
  }
  const unnamed = framing.end();
  if (unnamed) lines.push({ field: unnamed, value: "" });
  return lines;
}

describe("framing: lines and fields (WHATWG SSE)", () => {
  it("ends lines at LF, CR or CRLF, names data and event fields, and calls every other field other", () => {
    expect(frameLines("event: a\r\ndata: {}\rid: 7\n: comment\ndataX: 1\neventful: 2\nretry\n\ndata\n\n")).toEqual([
      { field: "event", value: " a" },
      { field: "data", value: " {}" },
      { field: "other", value: " 7" },
      { field: "other", value: " comment" },
      { field: "other", value: " 1" },
      // a name longer than "event" is no field we read: the rest of the line is its value
      { field: "other", value: "ul: 2" },
      { field: "other", value: "" },
      "blank",
      { field: "data", value: "" },
      "blank",
    ]);
  });

  it("a last line without its line break or colon still names its field at the end", () => {
    expect(frameLines("data: [DONE]\n\ndata")).toEqual([{ field: "data", value: " [DONE]" }, "blank", { field: "data", value: "" }]);
  });

  it("reports the same lines whatever the chunking, a CRLF split between chunks included", () => {
    const line = fc.tuple(
      fc.constantFrom("data", "event", "id", ": c", "datum"),
      fc.string({ maxLength: 20 }).filter((s) => !/[\r\n]/.test(s)),
    );
    const eol = fc.constantFrom("\n", "\r\n", "\r");
    const stream = fc.array(fc.tuple(fc.array(line, { maxLength: 4 }), eol), { maxLength: 6 });
    fc.assert(
      fc.property(stream, fc.array(fc.nat(), { maxLength: 10 }), (events, cuts) => {
        const text = events.map(([lines, e]) => lines.map(([name, v]) => `${name}:${v}${e}`).join("") + e).join("");
        expect(frameLines(text, cuts)).toEqual(frameLines(text));
      }),
    );
  });

  it("stops where the sink says: a value handler may read part of a value, or stop the feed", () => {
    const seen: string[] = [];
    const framing = sseFraming({
      lineStart: () => {},
      field: () => {},
      value: (chunk, from, to) => {
        seen.push(dec.decode(chunk.subarray(from, Math.min(to, from + 2))));
        return seen.length < 3 ? Math.min(to, from + 2) : -1;
      },
      lineEnd: () => seen.push("end"),
      blank: () => seen.push("blank"),
    });
    framing.feed(enc.encode("data:abcdef\n\n"));
    expect(seen).toEqual(["ab", "cd", "ef"]);
  });
});

describe("usage: a held data line rewritten", () => {
  const usage = { line: (v: string) => v.replace('"prompt_tokens":9', '"prompt_tokens":5') };

  it("gives the rewritten line with a space after the colon, whichever way the engine wrote it", () => {
    for (const raw of ['data: {"usage":{"prompt_tokens":9}}', 'data:{"usage":{"prompt_tokens":9}}']) {
      expect(dec.decode(rewriteDataLine(usage, enc.encode(raw))!)).toBe('data: {"usage":{"prompt_tokens":5}}');
    }
  });

  it("keeps the very bytes of a line the rewrite left as it was, and drops a line it returns null for", () => {
    const bytes = enc.encode('data: {"choices":[]}');
    expect(rewriteDataLine(usage, bytes)).toBe(bytes);
    expect(rewriteDataLine({ line: () => null }, bytes)).toBeNull();
  });
});

describe("completeness: the event that ends a stream", () => {
  const head = (s: string) => [...enc.encode(s)];
  const scanned = (s: string) => {
    const json = jsonTypeScan();
    for (const b of enc.encode(s)) json.byte(b);
    return json;
  };

  it("chat and completions: data [DONE], with or without the space, and nothing that only contains it", () => {
    const done = { kind: "done" } as const;
    expect(completesStream(done, null, null, head(" [DONE]"), 7)).toBe(true);
    expect(completesStream(done, null, null, head("[DONE]"), 6)).toBe(true);
    expect(completesStream(done, null, null, head(' "[DONE]"'), 9)).toBe(false);
    // the head is a value's first bytes: a long value that starts with [DONE] is not it
    expect(completesStream(done, null, null, head(" [DONE]"), 4000)).toBe(false);
  });

  it("Responses: a final event's type, from its event line, else its data's top-level type", () => {
    const final = { kind: "events", types: ["response.completed"] } as const;
    expect(completesStream(final, "response.completed", null, [], 10)).toBe(true);
    expect(completesStream(final, null, scanned('{"type":"response.completed","response":{}}'), [], 10)).toBe(true);
    expect(completesStream(final, null, scanned('{"response":{"type":"response.completed"}}'), [], 10)).toBe(false);
    expect(completesStream(final, "response.output_text.delta", scanned('{"type":"response.completed"}'), [], 10)).toBe(false);
    expect(completesStream(final, null, null, [], 10)).toBe(false);
  });
});
