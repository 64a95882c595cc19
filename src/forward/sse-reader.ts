import { engineErrorOf, opensError, type EngineError } from "./engine-error";

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
const encoder = new TextEncoder();
const decoder = new TextDecoder();
const text = (bytes: number[]) => decoder.decode(new Uint8Array(bytes));

type Field = "data" | "event" | "other";

/**
 * Incremental: `feed` each chunk as it comes and send on what it passes; `end` once the stream
 * ended cleanly. Then `complete` says whether it was. Any chunking of the same bytes gives the
 * same output and the same verdicts.
 */
export class SseReader {
  // the line being read
  private afterCR = false;
  private lineBytes = 0;
  private field: Field | null = null;
  private name = "";
  private skipSpace = false;
  private value: number[] = [];
  /** bytes of the line before its value (`data:` and the space after it) */
  private valueAt = 0;
  /** the line's bytes, held whole for the rewrite (null: not held) */
  private line: Uint8Array[] | null = null;
  private lineHeld = 0;
  /** the line just ended was dropped: so is its line break */
  private dropBreak = false;
  // the event being read
  private inEvent = false;
  private eventType: string | null = null;
  private dataLines = 0;
  private dataBytes = 0;
  /** the data's first bytes (an error event's, up to ERROR_HEAD_MAX), and an error's last */
  private head: number[] = [];
  private tail: number[] = [];
  private json: JsonTypeScan | null = null;
  /** lines of it passed, or were dropped */
  private kept = false;
  private dropped = false;
  /** undecided whether it is an error: its bytes are held */
  private pending = false;
  private held: Uint8Array[] = [];
  private heldBytes = 0;
  // verdicts
  private passedEvents = 0;
  private settled = false;
  private isComplete = false;
  private cut = false;
  private cutFirst = false;
  private errorData: string | null = null;
  private reported = false;
  /** a required rewrite met a line too long to hold: nothing more passes */
  tooLong = false;
  // the chunk being fed: its bytes not yet routed begin at `from`
  private chunk: Uint8Array = EMPTY;
  private from = 0;
  private out = new Output();

  constructor(
    private readonly rule: Completeness,
    private readonly rewrite: DataRewrite | null = null,
  ) {}

  /** The stream's first data-carrying event (or `event:` line) is known not to be an error: the status line may go out. */
  get firstSettled(): boolean {
    return this.settled;
  }

  /** After `end`: the stream reached its end marker ([DONE] or a final event). */
  get complete(): boolean {
    return this.isComplete;
  }

  feed(bytes: Uint8Array): SseRead {
    if (this.reported || this.tooLong) return { pass: EMPTY, error: null };
    this.chunk = bytes;
    this.from = 0;
    this.out = new Output();
    const n = bytes.length;
    /** where the next CR is (n: none): looked up once a feed, not once a line */
    let cr = -1;
    let i = 0;
    while (i < n && !this.tooLong) {
      const b = bytes[i]!;
      if (b === LF || b === CR) {
        const crlf = b === LF && this.afterCR;
        this.afterCR = b === CR;
        if (!crlf) {
          this.route(i);
          if (this.lineBytes) this.endLine(i);
          else this.endEvent(i);
        }
        this.route(++i);
        continue;
      }
      this.afterCR = false;
      if (!this.lineBytes) this.startLine(i);
      if (this.field === null) {
        // the field's name, up to its colon: "data" and "event" are all we look for
        this.lineBytes++;
        i++;
        if (b === COLON) this.fieldIs(this.lineBytes === 1 ? "other" : fieldOf(this.name));
        else if (this.name.length > 5) this.fieldIs("other");
        else this.name += String.fromCharCode(b);
        continue;
      }
      if (this.skipSpace) {
        this.skipSpace = false;
        if (b === 0x20) {
          this.lineBytes++;
          this.valueAt++;
          i++;
          continue;
        }
      }
      // the value, up to the line's end (or the chunk's): looked at, never copied
      if (cr < i) cr = indexOrEnd(bytes, CR, i);
      let end = Math.min(indexOrEnd(bytes, LF, i), cr);
      const deciding = this.pending && this.field === "data";
      // an event's first data line decides, at its ERROR_HEAD-th byte, whether it is an error
      if (deciding) end = Math.min(end, i + ERROR_HEAD - this.head.length);
      if (this.field === "data") this.dataValue(bytes, i, end);
      else if (this.field === "event") for (let k = i; k < end && this.value.length < SHORT; k++) this.value.push(bytes[k]!);
      this.lineBytes += end - i;
      i = end;
      if (deciding && this.head.length >= ERROR_HEAD) this.decide(i, opensError(text(this.head)), true);
      if (this.line && this.lineHeld + i - this.from > MAX_DATA_LINE_BYTES) this.overLong(i);
      if (this.pending && this.heldBytes + this.lineHeld + i - this.from > HOLD_MAX_BYTES) this.decide(i, false, false);
    }
    if (!this.tooLong) this.route(n);
    return { pass: this.out.bytes(), error: this.report() };
  }

  /** The stream ended cleanly: what was held passes (an unfinished event is not one, but its bytes go on), an error event is reported. */
  end(): SseRead {
    if (this.reported || this.tooLong) return { pass: EMPTY, error: null };
    this.chunk = EMPTY;
    this.from = 0;
    this.out = new Output();
    // a last line without a colon: a field with an empty value
    if (this.lineBytes && this.field === null) this.fieldIs(fieldOf(this.name));
    // an undecided last event that opens an error object: an error cut short
    if (this.pending && this.field === "data" && opensError(text(this.head))) this.decide(0, true, true);
    if (this.cut) {
      this.errorRead();
      return { pass: EMPTY, error: this.report() };
    }
    if (this.line) this.releaseLine(true);
    this.decide(0, false, false);
    // a bare [DONE] without its blank line still ends a stream
    if (this.rule.kind === "done" && this.dataLines && this.isDone()) this.isComplete = true;
    return { pass: this.out.bytes(), error: null };
  }

  /** Sends the chunk's bytes up to `to` where they go now: on, held (the line, or the undecided event), or nowhere (cut, dropped). */
  private route(to: number): void {
    if (to <= this.from) return;
    const part = this.chunk.subarray(this.from, to);
    this.from = to;
    if (this.cut || this.tooLong) return;
    if (this.line) {
      this.line.push(part);
      this.lineHeld += part.byteLength;
    } else if (!this.dropBreak) this.emit(part);
  }

  /** Bytes that may go on once the event is decided. */
  private emit(part: Uint8Array): void {
    if (this.pending) {
      this.held.push(part);
      this.heldBytes += part.byteLength;
    } else this.out.push(part);
  }

  private startLine(at: number): void {
    this.route(at);
    this.dropBreak = false;
    if (!this.inEvent) {
      this.inEvent = true;
      this.pending = !this.cut;
    }
    // held until its field is known; a data line until its end
    if (this.rewrite && !this.cut) this.line = [];
  }

  private fieldIs(field: Field): void {
    this.field = field;
    this.valueAt = this.lineBytes;
    this.skipSpace = true;
    if (field === "data") {
      // data lines join with a newline
      if (this.dataLines++) this.dataValue(new Uint8Array([LF]), 0, 1);
      if (this.rule.kind === "events" && this.eventType === null && !this.json) this.json = new JsonTypeScan();
    } else if (this.line) this.releaseLine(false);
  }

  private dataValue(bytes: Uint8Array, from: number, to: number): void {
    if (this.cut) to = Math.max(from, Math.min(to, from + ERROR_DATA_MAX - this.dataBytes));
    let k = from;
    while (k < to && this.head.length < (this.cut ? ERROR_HEAD_MAX : SHORT)) this.head.push(bytes[k++]!);
    if (this.cut && k < to) this.tail = [...this.tail, ...bytes.subarray(Math.max(k, to - ERROR_TAIL_MAX), to)].slice(-ERROR_TAIL_MAX);
    this.dataBytes += to - from;
    if (this.json) for (let k = from; k < to; k++) this.json.byte(bytes[k]!);
  }

  private endLine(at: number): void {
    if (this.field === null) this.fieldIs(fieldOf(this.name));
    const field = this.field;
    if (field === "event") this.eventType = text(this.value);
    if (this.pending && field !== "other") this.decide(at, field === "event" ? this.eventType === "error" : opensError(text(this.head)), true);
    // an error event's first data line holds its message
    if (this.cut && field === "data") this.errorRead();
    if (this.line) this.releaseLine(true);
    else this.kept ||= !this.cut;
    // many short lines (comments) hold no more than one long one
    if (this.pending && this.heldBytes > HOLD_MAX_BYTES) this.decide(at, false, false);
    this.lineBytes = 0;
    this.field = null;
    this.name = "";
    this.value = [];
  }

  /** A blank line: the event ends. */
  private endEvent(at: number): void {
    if (!this.inEvent) {
      this.dropBreak = false;
      return;
    }
    // an event without data (a comment, a keep-alive) is no error: it passes
    if (this.pending) this.decide(at, false, false);
    if (this.cut) this.errorRead();
    else if (this.dataLines) {
      this.passedEvents++;
      const type = this.eventType ?? this.json?.result() ?? null;
      if (this.rule.kind === "done" ? this.isDone() : type !== null && this.rule.types.includes(type)) this.isComplete = true;
    }
    // an event whose every line was dropped is dropped whole
    this.dropBreak = this.dropped && !this.kept;
    this.inEvent = false;
    this.eventType = null;
    this.dataLines = 0;
    this.dataBytes = 0;
    this.head = [];
    this.tail = [];
    this.json = null;
    this.kept = false;
    this.dropped = false;
  }

  private isDone(): boolean {
    return this.dataBytes <= SHORT && text(this.head).trim() === "[DONE]";
  }

  /** The event is decided at `at`: an error (cut there), or not (what was held goes on). `settles`: a data or event line decided it. */
  private decide(at: number, error: boolean, settles: boolean): void {
    this.route(at);
    this.pending = false;
    if (error) {
      this.cut = true;
      this.cutFirst = this.passedEvents === 0;
      this.line = null;
      this.lineHeld = 0;
    } else {
      for (const h of this.held) this.out.push(h);
      this.settled ||= settles;
    }
    this.held = [];
    this.heldBytes = 0;
  }

  /** The held line goes on: rewritten when it `ended` as a data line, else as it is. */
  private releaseLine(ended: boolean): void {
    const parts = this.line!;
    this.line = null;
    this.lineHeld = 0;
    const bytes = parts.length === 1 ? parts[0]! : join(parts);
    if (ended && this.field === "data") {
      const value = decoder.decode(bytes.subarray(this.valueAt));
      const line = this.rewrite!.line(value);
      if (line === null) {
        this.dropped = this.dropBreak = true;
        return;
      }
      this.kept = true;
      this.emit(line === value ? bytes : encoder.encode(`data: ${line}`));
    } else {
      this.kept = true;
      this.emit(bytes);
    }
  }

  /** The held line outgrew MAX_DATA_LINE_BYTES: it flows on unchanged, or (a required rewrite) the reader stops. */
  private overLong(at: number): void {
    this.route(at);
    if (this.rewrite!.required) this.tooLong = true;
    else this.releaseLine(false);
  }

  /** The error event's data is in (its first data line, its end, or the stream's): its head, and its tail when it was longer. */
  private errorRead(): void {
    this.errorData ??= text(this.head) + text(this.tail);
  }

  private report(): EngineError | null {
    if (this.cut && this.dataBytes >= ERROR_DATA_MAX) this.errorRead();
    if (this.errorData === null || this.reported) return null;
    this.reported = true;
    return { ...engineErrorOf(this.errorData), first: this.cutFirst };
  }
}

function fieldOf(name: string): Field {
  return name === "data" || name === "event" ? name : "other";
}

function indexOrEnd(bytes: Uint8Array, b: number, from: number): number {
  const at = bytes.indexOf(b, from);
  return at < 0 ? bytes.length : at;
}

function join(parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.byteLength, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.byteLength;
  }
  return out;
}

/** Views of the chunks fed, joined only when they are not one contiguous view already. */
class Output {
  private parts: Uint8Array[] = [];

  push(part: Uint8Array): void {
    if (!part.byteLength) return;
    const last = this.parts[this.parts.length - 1];
    if (last && last.buffer === part.buffer && last.byteOffset + last.byteLength === part.byteOffset) {
      this.parts[this.parts.length - 1] = new Uint8Array(last.buffer, last.byteOffset, last.byteLength + part.byteLength);
    } else this.parts.push(part);
  }

  bytes(): Uint8Array {
    return this.parts.length <= 1 ? (this.parts[0] ?? EMPTY) : join(this.parts);
  }
}

const QUOTE = 0x22;

/**
 * The top-level "type" member of one JSON object, read byte by byte in constant memory: null
 * unless the object is complete (a cut JSON text has no type) and that member is a plain string
 * (no escapes) of at most SHORT bytes.
 */
export class JsonTypeScan {
  private depth = 0;
  private inString = false;
  private escaped = false;
  /** at depth 1, what comes next: a key, or (after its colon) a value */
  private expect: "key" | "value" | null = null;
  /** the string being read is a key, or the value of "type" */
  private reading: "key" | "type" | null = null;
  private buf: number[] = [];
  private plain = true;
  private lastKeyIsType = false;
  private type: string | null = null;
  /** 1: the object closed; -1: not one JSON object */
  private state = 0;

  byte(b: number): void {
    if (this.state < 0) return;
    if (this.inString) {
      if (this.escaped) this.escaped = false;
      else if (b === 0x5c) this.escaped = true;
      else if (b === QUOTE) {
        this.inString = false;
        const s = this.reading && this.plain ? text(this.buf) : null;
        if (this.reading === "key") this.lastKeyIsType = s === "type";
        else if (this.reading === "type") this.type = s;
        return;
      }
      // an escaped key or value is never the plain "type" we look for
      if (this.escaped || this.buf.length >= SHORT) this.plain = false;
      else if (this.reading) this.buf.push(b);
      return;
    }
    if (b === 0x20 || b === LF || b === CR || b === 0x09) return;
    if (this.state > 0) {
      this.state = -1;
      return;
    }
    const top = this.depth === 1;
    const expect = this.expect;
    this.expect = null;
    switch (b) {
      case QUOTE:
        this.inString = true;
        this.buf = [];
        this.plain = true;
        this.reading = top && expect === "key" ? "key" : top && expect === "value" && this.lastKeyIsType ? "type" : null;
        return;
      case 0x7b: // {
      case 0x5b: // [
        if (!this.depth && b !== 0x7b) this.state = -1;
        if (++this.depth === 1) this.expect = "key";
        return;
      case 0x7d: // }
      case 0x5d: // ]
        if (--this.depth <= 0) this.state = this.depth ? -1 : 1;
        return;
      case 0x2c: // ,
        if (top) this.expect = "key";
        return;
      case COLON:
        if (top) this.expect = "value";
        return;
      default:
        // a number, true, false or null: a value, not the string we look for
        if (!this.depth) this.state = -1;
    }
  }

  /** The object's top-level "type", once the object is complete. */
  result(): string | null {
    return this.state > 0 ? this.type : null;
  }
}
