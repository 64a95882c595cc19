import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { eventTypeOf, preambleScan, RESPONSES_PREAMBLE } from "../../src/forward/decode-source";

// The type of an SSE event as readFirstEvent reads it to pass a Responses stream's preamble
// (response.created, response.in_progress: sent before D has produced anything) — pure.
describe("eventTypeOf", () => {
  it("reads the event line, else the data's own Responses type past the nested ones its response object holds", () => {
    expect(eventTypeOf('event: response.created\ndata: {"type":"response.created"}')).toBe("response.created");
    // no event line: the response object comes first, with nested types (text.format.type) before the event's own
    const created = `data: ${JSON.stringify({ response: { id: "resp_1", text: { format: { type: "text" } }, tools: [{ type: "function" }] }, sequence_number: 0, type: "response.created" })}`;
    expect(eventTypeOf(created)).toBe("response.created");
    expect(RESPONSES_PREAMBLE).toContain(eventTypeOf(created));
    // a delta whose text holds an escaped "type" is the delta
    const delta = `data: ${JSON.stringify({ delta: '{"type":"response.created"}', type: "response.output_text.delta" })}`;
    expect(eventTypeOf(delta)).toBe("response.output_text.delta");
    // a chat chunk (no Responses type): its first type, or "" — never a preamble
    expect(eventTypeOf('data: {"choices":[{"delta":{"content":"hi"}}]}')).toBe("");
    expect(eventTypeOf("data: [DONE]")).toBe("");
    // a comment has no type
    expect(eventTypeOf(": keep-alive")).toBeNull();
  });
});

// The scan readFirstEvent runs over a Responses stream's first bytes: whether a whole event of a
// type other than the preamble's has been read, however the bytes are chunked, each event read once.
describe("preambleScan", () => {
  const big = { id: "resp_1", instructions: "y".repeat(50_000), tools: [{ type: "function", name: "t" }], text: { format: { type: "text" } } };
  const lf = [
    `event: response.created\ndata: ${JSON.stringify({ type: "response.created", response: big })}\n\n`,
    // data-only framing: typed by its own response.* type
    `data: ${JSON.stringify({ response: big, type: "response.in_progress" })}\n\n`,
    ": keep-alive\n\n",
    `event: response.output_item.added\ndata: {"type":"response.output_item.added"}\n\n`,
  ].join("");
  /** the offset just past the blank line that ends the first non-preamble event */
  const firstOutputEnd = lf.length;

  it.each([
    ["LF", lf, firstOutputEnd],
    ["CRLF", lf.replace(/\n/g, "\r\n"), lf.replace(/\n/g, "\r\n").length],
    ["CR", lf.replace(/\n/g, "\r"), lf.replace(/\n/g, "\r").length],
  ])("%s line breaks: past only once the first output's event is whole, under any chunking", (_name, text, end) => {
    fc.assert(
      fc.property(fc.array(fc.integer({ min: 1, max: 70_000 }), { minLength: 1, maxLength: 40 }), (sizes) => {
        const scan = preambleScan(RESPONSES_PREAMBLE);
        let at = 0;
        let pastAt = -1;
        for (let i = 0; at < text.length; i++) {
          const size = sizes[i % sizes.length]!;
          const next = Math.min(text.length, at + size);
          if (scan(text.slice(at, next)) && pastAt < 0) pastAt = next;
          at = next;
        }
        // CR-only framing: a blank line's second CR is known as one only with the byte after it
        const cr = !text.includes("\n");
        if (cr) {
          expect(pastAt).toBe(-1);
          expect(scan("x")).toBe(true);
        } else {
          expect(pastAt).toBeGreaterThanOrEqual(end);
          expect(pastAt).toBeLessThanOrEqual(end + Math.max(...sizes));
        }
      }),
      { numRuns: 60 },
    );
  });

  it("a preamble alone, however long, is never past", () => {
    const scan = preambleScan(RESPONSES_PREAMBLE);
    const preambleOnly = lf.slice(0, lf.indexOf("event: response.output_item.added"));
    for (let at = 0; at < preambleOnly.length; at += 1024) expect(scan(preambleOnly.slice(at, at + 1024))).toBe(false);
    // the first output's event, its blank line split across two chunks
    expect(scan('event: response.output_item.added\ndata: {"type":"response.output_item.added"}\n')).toBe(false);
    expect(scan("\n")).toBe(true);
  });
});
