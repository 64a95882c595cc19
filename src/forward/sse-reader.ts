import { engineErrorOf, opensError, type EngineError } from "./engine-error";
import { sseFraming, type Field } from "./sse-framing";

// The one reader of a decode node's SSE stream. It reads the bytes once, as they pass, into
// lines, fields and events (WHATWG SSE framing: lines end in LF, CR or CRLF; an event ends at a
// blank line; `event:` lines and `data:`-only events alike), and takes every decision the relay
// needs from those events:
// - an engine's error event (engine-error.ts): the stream is cut at its start, so neither it nor
//   the [DONE] after it reaches the client;
// - completeness: whether the stream ended with `data: [DONE]` or a Responses final event;
// - rewriting: a data line's value handed to a rewrite (the client's usage from P's counts, a
//   batch's choice numbers), held whole for it up to MAX_DATA_LINE_BYTES.
// Every other byte passes unchanged, as views of the chunks fed. It holds only what a decision
// waits for: an event's opening bytes while it could still be an error (HOLD_MAX_BYTES at
// most), and the data line being rewritten; a 48 MB line without a newline costs nothing.
// Hand-written rather than eventsource-parser: that parser holds an event's whole data (or
// stops at its maxBufferSize), and gives back events, not the bytes to relay.

/** What a complete stream ends with: `data: [DONE]` (chat, completions, /generate), or one of these event types (Responses). */
export type Completeness = { kind: "done" } | { kind: "events"; types: readonly string[] };

/** A rewrite of data lines. */
export interface DataRewrite {
  /** the line's new value (the same string keeps its bytes), or null to drop the line (and its event, once nothing of it is left) */
  line(value: string): string | null;
  /** a line too long to hold cannot pass unrewritten (a batch must renumber every event): the reader stops, `tooLong` */
  required?: boolean;
}

/** One feed's result: the bytes that go on to the client, and the engine's error once its event was read. */
export interface SseRead {
  pass: Uint8Array;
  /** set once, when the error event's data is read; nothing from its start on passes */
  error: EngineError | null;
}

/** An event still undecided after this many bytes (long comments, many fields before its data) is not an error. */
export const HOLD_MAX_BYTES = 4096;
/** A data line is held for rewriting up to this size; past it, it flows on unchanged (a D that never sends a newline). */
export const MAX_DATA_LINE_BYTES = 1 << 20;

const LF = 0x0a;
const CR = 0x0d;
const COLON = 0x3a;
const QUOTE = 0x22;
/** bytes of a data value kept: enough to tell `[DONE]`; an `event:` value longer than this is no type we look for */
const SHORT = 128;
/** bytes of an event's first data line read to tell whether it opens an error object */
const ERROR_HEAD = 64;
/** bytes of an error event's data kept: its head (the message) and its tail (vLLM writes the code last) */
const ERROR_HEAD_MAX = 4096;
const ERROR_TAIL_MAX = 64;
/** bytes of an error event's data read at most: the error is reported then, if its line has not ended */
const ERROR_DATA_MAX = 1 << 16;
const EMPTY = new Uint8Array(0);
const NEWLINE = new Uint8Array([LF]);
const encoder = new TextEncoder();
const decoder = new TextDecoder();
const text = (bytes: number[]) => decoder.decode(new Uint8Array(bytes));

/** Reads one stream. */
export interface SseReader {
  /** A chunk as it comes: what of it goes on, and the engine's error once its event was read. */
  feed(bytes: Uint8Array): SseRead;
  /** The stream ended cleanly: what was held passes (an unfinished event is not one, but its bytes go on); an error event is reported. */
  end(): SseRead;
  /** after `end`: the stream reached its end ([DONE], or a final event) */
  readonly complete: boolean;
  /** the stream's first event with data (or an `event:` line) is known not to be an error: the status line may go out */
  readonly settled: boolean;
  /** a required rewrite met a line too long to hold: nothing more passes */
  readonly tooLong: boolean;
}

/**
 * An incremental reader: `feed` each chunk as it comes and send on what it passes; `end` once
 * the stream ended cleanly. Any chunking of the same bytes gives the same output and verdicts.
 * Four steps, each its own function: framing (`sseFraming` in sse-framing.ts: lines and fields),
 * events (this function: which bytes go on, are held while an event could be an error, or are
 * cut at an error), usage (`rewriteDataLine`: a held data line rewritten) and completeness
 * (`completesStream`). (Closures rather than classes: their state minifies to short names, and
 * the Worker is loaded on every cold start.)
 */
export function sseReader(rule: Completeness, rewrite: DataRewrite | null = null): SseReader {
  let complete = false;
  let settled = false;
  let tooLong = false;
  // the line being read: its field once known (the framing reads its name)
  let field: Field | null = null;
  /** an `event:` line's value */
  let value: number[] = [];
  /** the line's bytes, held whole for the rewrite (null: not held) */
  let line: Uint8Array[] | null = null;
  let lineHeld = 0;
  /** the line just ended was dropped: so is its line break */
  let dropBreak = false;
  // the event being read
  let inEvent = false;
  let eventType: string | null = null;
  let dataLines = 0;
  let dataBytes = 0;
  /** the data's first bytes (an error event's, up to ERROR_HEAD_MAX), and an error's last */
  let head: number[] = [];
  let tail: number[] = [];
  let json: JsonTypeScan | null = null;
  /** lines of it passed, or were dropped */
  let kept = false;
  let dropped = false;
  /** undecided whether it is an error: its bytes are held */
  let pending = false;
  let held: Uint8Array[] = [];
  let heldBytes = 0;
  // the error event, once one began
  let passedAny = false;
  let cut = false;
  let cutFirst = false;
  let errorData: string | null = null;
  let reported = false;
  // the chunk being fed: its bytes not yet routed begin at `from`
  let chunk: Uint8Array = EMPTY;
  let from = 0;
  let out: Uint8Array[] = [];

  const begin = (bytes: Uint8Array) => {
    chunk = bytes;
    from = 0;
    out = [];
  };

  /** Bytes that go on once the event is decided. */
  const emit = (part: Uint8Array) => {
    if (pending) {
      held.push(part);
      heldBytes += part.length;
    } else out.push(part);
  };

  /** Sends the chunk's bytes up to `to` where they go now: on, held (the line, or the undecided event), or nowhere (cut, dropped). */
  const route = (to: number) => {
    if (to <= from) return;
    const part = chunk.subarray(from, to);
    from = to;
    if (cut || tooLong) return;
    if (line) {
      line.push(part);
      lineHeld += part.length;
    } else if (!dropBreak) emit(part);
  };

  /** The event is decided at `at`: an error (cut there), or not (what was held goes on). `settles`: a data or event line decided it. */
  const decide = (at: number, error: boolean, settles: boolean) => {
    route(at);
    pending = false;
    if (error) {
      cut = true;
      cutFirst = !passedAny;
      line = null;
      lineHeld = 0;
    } else {
      out.push(...held);
      settled ||= settles;
    }
    held = [];
    heldBytes = 0;
  };

  /** The held line goes on: rewritten when it `ended` as a data line, else as it is. */
  const releaseLine = (ended: boolean) => {
    let bytes: Uint8Array | null = joinBytes(line!);
    line = null;
    lineHeld = 0;
    if (ended && field === "data") {
      bytes = rewriteDataLine(rewrite!, bytes);
      if (bytes === null) {
        dropped = dropBreak = true;
        return;
      }
    }
    kept = true;
    emit(bytes);
  };

  /** A data value's bytes (with the space after the colon: JSON, `[DONE]` and the error test ignore it). */
  const dataValue = (bytes: Uint8Array, start: number, to: number) => {
    if (cut) to = Math.max(start, Math.min(to, start + ERROR_DATA_MAX - dataBytes));
    let k = start;
    while (k < to && head.length < (cut ? ERROR_HEAD_MAX : SHORT)) head.push(bytes[k++]!);
    if (cut && k < to) tail = [...tail, ...bytes.subarray(Math.max(k, to - ERROR_TAIL_MAX), to)].slice(-ERROR_TAIL_MAX);
    dataBytes += to - start;
    if (json) for (k = start; k < to; k++) json.byte(bytes[k]!);
  };

  const fieldIs = (f: Field) => {
    field = f;
    if (f !== "data") {
      if (line) releaseLine(false);
      return;
    }
    // data lines join with a newline
    if (dataLines++) dataValue(NEWLINE, 0, 1);
    if (rule.kind === "events" && eventType === null) json ??= jsonTypeScan();
  };

  /** The error event's data is in (its first data line, its end, or the stream's): its head, and its tail when it was longer. */
  const errorRead = () => {
    errorData ??= text(head) + text(tail);
  };

  const report = (): EngineError | null => {
    if (cut && dataBytes >= ERROR_DATA_MAX) errorRead();
    if (errorData === null || reported) return null;
    reported = true;
    return { ...engineErrorOf(errorData), first: cutFirst };
  };

  /** The framing's news, as it reads the chunk being fed. */
  const framing = sseFraming({
    lineStart(at) {
      // a line begins: held until its field is known when a rewrite is on, a data line until its end
      route(at);
      dropBreak = false;
      if (!inEvent) {
        inEvent = true;
        pending = !cut;
      }
      if (rewrite && !cut) line = [];
    },
    field: fieldIs,
    value(bytes, i, end) {
      // the value, up to the line's end (or the chunk's): looked at, never copied; an event's
      // first data line decides, at its ERROR_HEAD-th byte, whether it is an error
      const deciding = pending && field === "data";
      if (deciding) end = Math.min(end, i + ERROR_HEAD - head.length);
      if (field === "data") dataValue(bytes, i, end);
      else if (field === "event") value.push(...bytes.subarray(i, Math.min(end, i + SHORT - value.length)));
      i = end;
      if (deciding && head.length >= ERROR_HEAD) decide(i, opensError(text(head)), true);
      if (line && lineHeld + i - from > MAX_DATA_LINE_BYTES) {
        route(i);
        // too long to hold: it flows on unchanged, or (a required rewrite) the reader stops
        if (rewrite!.required) tooLong = true;
        else releaseLine(false);
      }
      if (pending && heldBytes + lineHeld + i - from > HOLD_MAX_BYTES) decide(i, false, false);
      return tooLong ? -1 : i;
    },
    lineEnd(at, unnamed) {
      route(at);
      if (unnamed) fieldIs(unnamed);
      if (field === "event") {
        const v = text(value);
        eventType = v[0] === " " ? v.slice(1) : v;
      }
      if (pending && field !== "other") decide(at, field === "event" ? eventType === "error" : opensError(text(head)), true);
      // an error event's first data line holds its message
      if (cut && field === "data") errorRead();
      if (line) releaseLine(true);
      // many short lines (comments) hold no more than one long one
      if (pending && heldBytes > HOLD_MAX_BYTES) decide(at, false, false);
      field = null;
      value = [];
    },
    blank(at) {
      // a blank line: the event ends (an event whose every line was dropped is dropped whole)
      route(at);
      if (inEvent) {
        // an event without data (a comment, a keep-alive) is no error: it passes
        if (pending) decide(at, false, false);
        if (cut) errorRead();
        else if (dataLines) {
          passedAny = true;
          if (completesStream(rule, eventType, json, head, dataBytes)) complete = true;
        }
      }
      dropBreak = dropped && !kept;
      inEvent = kept = dropped = false;
      eventType = json = null;
      dataLines = dataBytes = 0;
      head = [];
      tail = [];
    },
  });

  const stopped = (): SseRead | null => (reported || tooLong ? { pass: EMPTY, error: null } : null);

  return {
    get complete() {
      return complete;
    },
    get settled() {
      return settled;
    },
    get tooLong() {
      return tooLong;
    },

    feed(bytes) {
      const stop = stopped();
      if (stop) return stop;
      begin(bytes);
      framing.feed(bytes);
      if (!tooLong) route(bytes.length);
      return { pass: joinBytes(out), error: report() };
    },

    end() {
      const stop = stopped();
      if (stop) return stop;
      begin(EMPTY);
      // a last line without a colon: a field with an empty value
      const unnamed = framing.end();
      if (unnamed) fieldIs(unnamed);
      // an undecided last event that opens an error object: an error cut short
      if (pending && field === "data" && opensError(text(head))) decide(0, true, true);
      if (cut) errorRead();
      else {
        if (line) releaseLine(true);
        decide(0, false, false);
        // a bare [DONE] without its blank line still ends a stream
        if (rule.kind === "done" && dataLines && isDone(head, dataBytes)) complete = true;
      }
      return { pass: joinBytes(out), error: report() };
    },
  };
}

/**
 * The usage step: a held data line (`data:`, its value, no line break) rewritten — the client's
 * usage from P's counts, a batch's choice numbers. The new line's bytes; the same bytes when the
 * rewrite kept the value; null to drop the line.
 */
export function rewriteDataLine(rewrite: DataRewrite, bytes: Uint8Array): Uint8Array | null {
  const text = decoder.decode(bytes);
  const old = text.slice(text[5] === " " ? 6 : 5);
  const next = rewrite.line(old);
  if (next === null) return null;
  return next === old ? bytes : encoder.encode(`data: ${next}`);
}

/** `data: [DONE]`: an event's data, from its first SHORT bytes and its size. */
export const isDone = (head: number[], dataBytes: number) => dataBytes <= SHORT && text(head).trim() === "[DONE]";

/**
 * The completeness step: whether an event with data ends the stream as the rule wants — `[DONE]`,
 * or a final event's type (its `event:` line, else its data's top-level "type" as `json` read it).
 */
export function completesStream(rule: Completeness, eventType: string | null, json: JsonTypeScan | null, head: number[], dataBytes: number): boolean {
  return rule.kind === "done" ? isDone(head, dataBytes) : rule.types.includes((eventType ?? json?.result())!);
}

/**
 * The parts as one array: the part itself when there is one, and a view when they lie side by side
 * in one buffer (a chunk's lines passed unchanged: the usual case) — no copy in either.
 */
export function joinBytes(parts: Uint8Array[]): Uint8Array {
  parts = parts.filter((p) => p.length);
  if (parts.length < 2) return parts[0] ?? EMPTY;
  const first = parts[0]!;
  let end = first.byteOffset + first.byteLength;
  for (let k = 1; k < parts.length && end >= 0; k++) {
    const p = parts[k]!;
    end = p.buffer === first.buffer && p.byteOffset === end ? end + p.byteLength : -1;
  }
  if (end >= 0) return new Uint8Array(first.buffer, first.byteOffset, end - first.byteOffset);
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/** The top-level "type" member of one JSON object, read byte by byte. */
export interface JsonTypeScan {
  byte(b: number): void;
  /** the object's top-level "type", once the object is complete */
  result(): string | null;
}

/**
 * Reads one JSON object's top-level "type" in constant memory: null unless the object is
 * complete (a cut JSON text has no type) and that member is a plain string (no escapes) of at
 * most SHORT bytes.
 */
export function jsonTypeScan(): JsonTypeScan {
  let depth = 0;
  /** 0: outside a string; 1: in one; 2: just after a backslash in one */
  let str = 0;
  /** at depth 1, what comes next: 1 a key, 2 a value */
  let expect = 0;
  /** the string being read: 1 a key, 2 the value of "type", 0 neither */
  let reading = 0;
  /** its bytes (null: escaped or too long, so not the plain string we look for) */
  let buf: number[] | null = null;
  let typeKey = false;
  let type: string | null = null;
  /** 1: the object closed; -1: not one JSON object */
  let state = 0;
  return {
    byte(b) {
      if (state < 0) return;
      if (str) {
        if (str > 1) str = 1;
        else if (b === 0x5c) {
          str = 2;
          buf = null;
        } else if (b === QUOTE) {
          str = 0;
          const s = reading && buf ? text(buf) : null;
          if (reading === 1) typeKey = s === "type";
          else if (reading) type = s;
        } else if (buf && reading) {
          if (buf.length < SHORT) buf.push(b);
          else buf = null;
        }
        return;
      }
      if (b === 0x20 || b === LF || b === CR || b === 0x09) return;
      if (state) {
        state = -1;
        return;
      }
      const top = depth === 1;
      const next = expect;
      expect = 0;
      if (b === QUOTE) {
        str = 1;
        buf = [];
        reading = !top ? 0 : next === 1 ? 1 : next === 2 && typeKey ? 2 : 0;
      } else if (b === 0x7b || b === 0x5b) {
        // { or [
        if (!depth && b !== 0x7b) state = -1;
        if (++depth === 1) expect = 1;
      } else if (b === 0x7d || b === 0x5d) {
        // } or ]
        if (--depth <= 0) state = depth ? -1 : 1;
      } else if (b === 0x2c) {
        if (top) expect = 1;
      } else if (b === COLON) {
        if (top) expect = 2;
      } else if (!depth) state = -1; // a number, true, false or null alone: not an object
    },
    result: () => (state > 0 ? type : null),
  };
}
