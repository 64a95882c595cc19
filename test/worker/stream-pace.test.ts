import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { streamPace } from "../../src/forward/stream-pace";

// The relay's count of a stream's data events (the pace node-rates.ts learns D's decode step
// from), pure: the lines that begin with "data:", however the bytes are chunked.
describe("streamPace", () => {
  const encoder = new TextEncoder();
  const pieces = [
    'data: {"choices":[]}\n',
    "data:[DONE]\n",
    "\n",
    ": keep-alive\n",
    "event: response.output_text.delta\n",
    "dat\n",
    "da",
    "ta:",
    " x\n",
    "xdata: y\n",
    'data: {"a":1}\r\n',
    "\r\n",
  ];
  /** the reference: lines of the whole text that start with "data:" */
  const expected = (text: string) => text.split("\n").filter((line) => line.startsWith("data:")).length;

  it("counts the lines that begin with data:, under any chunking", () => {
    fc.assert(
      fc.property(fc.array(fc.constantFrom(...pieces), { maxLength: 60 }), fc.array(fc.integer({ min: 1, max: 40 }), { minLength: 1, maxLength: 20 }), (parts, sizes) => {
        const text = parts.join("");
        const bytes = encoder.encode(text);
        const pace = streamPace();
        for (let at = 0, i = 0; at < bytes.length; i++) {
          const next = Math.min(bytes.length, at + sizes[i % sizes.length]!);
          pace.watch(bytes.subarray(at, next));
          at = next;
        }
        expect(pace.events).toBe(expected(text));
        // the first and last event's times are set exactly when there was one
        expect(pace.first > 0).toBe(pace.events > 0);
        expect(pace.last >= pace.first).toBe(true);
      }),
      { numRuns: 300 },
    );
  });
});
