import { createParser, type EventSourceMessage } from "eventsource-parser";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { HOLD_MAX_BYTES, joinBytes, MAX_DATA_LINE_BYTES, sseReader, type Completeness, type DataRewrite } from "../../src/forward/sse-reader";
import { fixUsage, fixUsageInBody, usageRewrite } from "../../src/forward/stream";
import { feedReader, type Fed } from "../support/sse-feed";
import { withoutFileEngines } from "./helpers";

withoutFileEngines();

// The one reader of D's stream (src/forward/sse-reader.ts) takes three decisions from the same
// parsed events — the engine's error event, completeness, the data lines to rewrite — and relays
// every other byte unchanged. Its promise: any chunking of the same bytes gives the same output
// bytes and the same verdicts, and it holds no more than a decision waits for. The reference for
// "what a client sees" is eventsource-parser, the parser OpenAI-compatible SDKs build on.

const enc = new TextEncoder();
const dec = new TextDecoder();
const DONE: Completeness = { kind: "done" };
const RESPONSES: Completeness = { kind: "events", types: ["response.completed"] };

const chunk = (text: string, index = 0) => JSON.stringify({ id: "cmpl-1", object: "text_completion", choices: [{ index, text, finish_reason: null }] });
const usageLine = (prompt: number, cached?: number) =>
  JSON.stringify({
    id: "cmpl-1",
    choices: [],
    usage: { prompt_tokens: prompt, completion_tokens: 3, total_tokens: prompt + 3, ...(cached === undefined ? {} : { prompt_tokens_details: { cached_tokens: cached } }) },
  });

/** One SSE event of a kind engines send (or a proxy might), framed with its line ending. */
type Part =
  | { kind: "chunk"; text: string }
  | { kind: "usage"; prompt: number }
  | { kind: "comment"; len: number }
  | { kind: "comments"; lines: number }
  | { kind: "typed"; type: string }
  | { kind: "fields"; text: string }
  | { kind: "multi" }
  | { kind: "done" }
  | { kind: "error"; code: number }
  | { kind: "big"; size: number };

const text = fc.oneof(fc.string({ maxLength: 20 }), fc.constantFrom("data: [DONE]", '{"error": {"message": "x"}}', '"usage"', "\\n\\n", "ü€😀", "event: error"));
const part: fc.Arbitrary<Part> = fc.oneof(
  { weight: 6, arbitrary: text.map((t) => ({ kind: "chunk" as const, text: t })) },
  { weight: 2, arbitrary: fc.nat({ max: 9000 }).map((prompt) => ({ kind: "usage" as const, prompt })) },
  { weight: 1, arbitrary: fc.nat({ max: 6000 }).map((len) => ({ kind: "comment" as const, len })) },
  { weight: 1, arbitrary: fc.nat({ max: 3000 }).map((lines) => ({ kind: "comments" as const, lines })) },
  { weight: 1, arbitrary: fc.constantFrom("response.created", "response.completed", "error").map((type) => ({ kind: "typed" as const, type })) },
  { weight: 1, arbitrary: text.map((t) => ({ kind: "fields" as const, text: t })) },
  { weight: 1, arbitrary: fc.constant({ kind: "multi" as const }) },
  { weight: 1, arbitrary: fc.constant({ kind: "done" as const }) },
  { weight: 1, arbitrary: fc.constantFrom(400, 500, 503).map((code) => ({ kind: "error" as const, code })) },
  { weight: 1, arbitrary: fc.nat({ max: 20_000 }).map((size) => ({ kind: "big" as const, size })) },
);
const eol = fc.constantFrom("\n", "\r\n", "\r");

function frame(p: Part, e: string): string {
  switch (p.kind) {
    case "chunk":
      return `data: ${chunk(p.text)}${e}${e}`;
    case "usage":
      return `data: ${usageLine(p.prompt, p.prompt % 3 ? undefined : p.prompt >> 1)}${e}${e}`;
    case "comment":
      return `: ${"k".repeat(p.len)}${e}${e}`;
    case "comments":
      return `${`:${e}`.repeat(p.lines)}data: ${chunk("after comments")}${e}${e}`;
    case "typed":
      return `event: ${p.type}${e}data: ${JSON.stringify({ type: p.type, response: { id: "resp_1" } })}${e}${e}`;
    case "fields":
      return `id: 7${e}retry: 10${e}foo${e}data:${chunk(p.text)}${e}${e}`;
    case "multi":
      return `data: {"choices":${e}data: []}${e}${e}`;
    case "done":
      return `data: [DONE]${e}${e}`;
    case "error":
      return `data: ${JSON.stringify({ error: { message: `failed ${p.code}`, type: "x", param: null, code: p.code } })}${e}${e}`;
    case "big":
      return `data: ${chunk("b".repeat(p.size))}${e}${e}`;
  }
}

/** A stream: its events, each with its own line ending, the last one perhaps cut short. */
const stream = fc.tuple(fc.array(fc.tuple(part, eol), { maxLength: 10 }), fc.nat({ max: 40 })).map(([parts, cutEnd]) => {
  const whole = parts.map(([p, e]) => frame(p, e)).join("");
  // a third of the streams end cleanly in the middle of their last bytes
  return cutEnd < 13 ? whole.slice(0, Math.max(0, whole.length - cutEnd)) : whole;
});
const cuts = fc.array(fc.nat({ max: 60_000 }), { maxLength: 20 });

/** Drops [DONE] and usage-only events, renumbers the rest: what a batch does to a prompt's stream. */
const renumber: DataRewrite = {
  required: true,
  line(value) {
    if (value.trim() === "[DONE]") return null;
    try {
      const json = JSON.parse(value);
      if (json?.choices?.length === 0 && json.usage) return null;
      for (const c of json?.choices ?? []) c.index += 10;
      return JSON.stringify(json);
    } catch {
      return value;
    }
  },
};
const rewrites: Record<string, DataRewrite | null> = { none: null, usage: usageRewrite(fixUsage({ promptTokens: 42, cachedTokens: 40 })), renumber };

const verdicts = (r: Fed) => ({ out: r.out, error: r.error, errors: r.errors, complete: r.complete, settled: r.settled, tooLong: r.tooLong });

/** The events a client's SSE parser (eventsource-parser) reads from these bytes. */
function clientEvents(bytes: string): Array<Pick<EventSourceMessage, "event" | "data">> {
  const events: Array<Pick<EventSourceMessage, "event" | "data">> = [];
  const parser = createParser({ onEvent: (e) => events.push({ event: e.event, data: e.data }) });
  // two line breaks more: a last CR is a line's end, not one that waits for its LF
  parser.feed(`${bytes}\n\n`);
  return events;
}

describe("sseReader: any chunking of the same bytes gives the same output and the same verdicts", () => {
  for (const [name, rewrite] of Object.entries(rewrites)) {
    for (const rule of [DONE, RESPONSES]) {
      it(`rewrite ${name}, completeness ${rule.kind}: in one piece, in random pieces, byte by byte`, () => {
        fc.assert(
          fc.property(stream, cuts, (text, c) => {
            const whole = verdicts(feedReader(text, [], rule, rewrite));
            expect(verdicts(feedReader(text, c, rule, rewrite))).toEqual(whole);
            const everyByte = Array.from({ length: text.length }, (_, k) => k);
            if (text.length < 3000) expect(verdicts(feedReader(text, everyByte, rule, rewrite))).toEqual(whole);
          }),
          { numRuns: 150 },
        );
      });
    }
  }
});

describe("sseReader: what passes is what D sent, but for the rewritten lines and the cut at an error event", () => {
  /** where the first error event begins, as a client's parser would find it: the output is the input up to there */
  const untilError = (text: string) => {
    const events = clientEvents(text);
    const k = events.findIndex((e) => e.event === "error" || /^\s*\{\s*"error"/.test(e.data));
    return k < 0 ? null : events.slice(0, k);
  };

  it("without a rewrite: every byte up to the first error event, unchanged; after it, nothing", () => {
    fc.assert(
      fc.property(stream, cuts, (text, c) => {
        const r = feedReader(text, c, DONE);
        const before = untilError(text);
        if (before === null) {
          expect(r.out).toBe(text);
          expect(r.error).toBeNull();
        } else {
          expect(text.startsWith(r.out)).toBe(true);
          expect(clientEvents(r.out)).toEqual(before);
          expect(r.errors).toBe(1);
        }
      }),
      { numRuns: 300 },
    );
  });

  it("usage rewrite: a client reads the same events, each usage line with P's counts; every other line byte for byte", () => {
    const fix = fixUsage({ promptTokens: 42, cachedTokens: 40 });
    fc.assert(
      fc.property(stream, cuts, (text, c) => {
        fc.pre(untilError(text) === null);
        const r = feedReader(text, c, DONE, usageRewrite(fix));
        const expected = clientEvents(text).map((e) => (e.data.includes('"usage"') ? { ...e, data: fixUsageInBody(e.data, fix) } : e));
        expect(clientEvents(r.out)).toEqual(expected);
        // what is not a usage line is unchanged
        const unchanged = (s: string) => s.split(/\r\n|\r|\n/).filter((l) => !l.includes('"usage"'));
        expect(unchanged(r.out)).toEqual(unchanged(text));
      }),
      { numRuns: 300 },
    );
  });

  it("a rewrite that drops lines: their events vanish whole, line breaks included; the others are rewritten", () => {
    fc.assert(
      fc.property(stream, cuts, (text, c) => {
        fc.pre(untilError(text) === null);
        const r = feedReader(text, c, DONE, renumber);
        const expected = clientEvents(text).flatMap((e) => {
          const data = e.data.split("\n").flatMap((l) => {
            const v = renumber.line(l);
            return v === null ? [] : [v];
          });
          return data.length ? [{ ...e, data: data.join("\n") }] : [];
        });
        expect(clientEvents(r.out)).toEqual(expected);
        // a dropped event leaves no blank line behind: no three line breaks in a row appear that were not sent
        if (!/(\r\n|\r|\n){3}/.test(text)) expect(/(\r\n|\r|\n){3}/.test(r.out)).toBe(false);
      }),
      { numRuns: 300 },
    );
  });
});

describe("sseReader: it holds only what a decision waits for", () => {
  it("without a rewrite, at most HOLD_MAX_BYTES (and a line break) are held back at any time: one undecided event's opening bytes", () => {
    fc.assert(
      fc.property(stream, cuts, (text, c) => {
        fc.pre(untilErrorFree(text));
        const reader = sseReader(DONE);
        const bytes = enc.encode(text);
        let fed = 0;
        let passed = 0;
        let at = 0;
        for (const cut of [...new Set(c.filter((x) => x > 0 && x < bytes.length)), bytes.length].sort((a, b) => a - b)) {
          passed += reader.feed(bytes.subarray(at, cut)).pass.byteLength;
          fed += cut - at;
          at = cut;
          expect(fed - passed).toBeLessThanOrEqual(HOLD_MAX_BYTES + 8);
        }
      }),
      { numRuns: 300 },
    );
  });

  it("a usage line is held whole up to MAX_DATA_LINE_BYTES; a longer line flows on unchanged from there (16 MB)", () => {
    const reader = sseReader(DONE, usageRewrite(fixUsage({ promptTokens: 1, cachedTokens: 0 })));
    const head = enc.encode(`data: ${usageLine(1).slice(0, -1)},"pad":"`);
    const piece = enc.encode("x".repeat(64 << 10));
    expect(reader.feed(head).pass.byteLength).toBe(0);
    let fed = head.byteLength;
    let passed = 0;
    while (fed < 16 << 20) {
      passed += reader.feed(piece).pass.byteLength;
      fed += piece.byteLength;
      expect(fed - passed).toBeLessThanOrEqual(MAX_DATA_LINE_BYTES + piece.byteLength);
    }
    // past the limit the line flows: nothing of it is held
    expect(passed).toBe(fed);
    const tail = reader.feed(enc.encode('"}\n\ndata: [DONE]\n\n')).pass;
    expect(dec.decode(tail)).toBe('"}\n\ndata: [DONE]\n\n');
    expect(reader.end().pass.byteLength).toBe(0);
    expect(reader.complete).toBe(true);
  });

  it("a rewrite that must see every line (a batch) stops at a line too long to hold: tooLong, nothing of it passes", () => {
    const events = `data: ${chunk("a")}\n\n`;
    const long = `data: ${chunk("z".repeat(MAX_DATA_LINE_BYTES))}\n\ndata: [DONE]\n\n`;
    for (const c of [[], [events.length + 10], [events.length + 100_000, events.length + 1_100_000]]) {
      const r = feedReader(events + long, c, DONE, renumber);
      expect(r.tooLong).toBe(true);
      expect(r.out).toBe(`data: ${chunk("a", 10)}\n\n`);
      expect(r.complete).toBe(false);
    }
  });
});

function untilErrorFree(text: string): boolean {
  return !clientEvents(text).some((e) => e.event === "error" || /^\s*\{\s*"error"/.test(e.data));
}

describe("joinBytes", () => {
  const bytes = new TextEncoder().encode('data: {"a":1}\n\ndata: [DONE]\n\n');
  it("parts side by side in one buffer come back as one view of it (a chunk whose held lines passed unchanged), others as a copy", () => {
    const parts = [bytes.subarray(0, 13), bytes.subarray(13, 14), bytes.subarray(14, 15), bytes.subarray(15)];
    const joined = joinBytes(parts);
    expect(joined.buffer).toBe(bytes.buffer);
    expect(joined.byteOffset).toBe(0);
    expect(joined).toEqual(bytes);
    // out of order, a gap, or another buffer: a copy with the parts' bytes in order
    const swapped = joinBytes([bytes.subarray(15), bytes.subarray(0, 15)]);
    expect(swapped.buffer).not.toBe(bytes.buffer);
    expect(new TextDecoder().decode(swapped)).toBe('data: [DONE]\n\ndata: {"a":1}\n\n');
    expect(new TextDecoder().decode(joinBytes([bytes.subarray(0, 5), bytes.subarray(6, 8)]))).toBe('data:{"');
    const other = new TextEncoder().encode("x");
    expect(new TextDecoder().decode(joinBytes([bytes.subarray(0, 5), other]))).toBe("data:x");
    // empty parts are left out
    expect(joinBytes([new Uint8Array(0), bytes.subarray(0, 4), new Uint8Array(0)]).buffer).toBe(bytes.buffer);
  });
});
