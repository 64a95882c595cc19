// Reads an SSE byte stream event by event to tell how it ended, in constant memory: the bytes
// are looked at once as they pass and never held (a 48 MB line costs nothing). Per event it
// reports the type — the `event:` field, else the top-level "type" member of its JSON data —
// and whether its data is `[DONE]`. Framing per the WHATWG SSE spec (lines end in LF, CR or
// CRLF; an event ends at a blank line; an event not ended by one is not an event: a client's
// SSE parser drops it too). Hand-written rather than eventsource-parser: that parser buffers an
// event's whole data (or stops at its maxBufferSize), so a large final event would cost memory
// or be judged wrong.

export interface SseEventInfo {
  /** the `event:` field, else the top-level "type" of a complete JSON object in `data:`; null when neither */
  type: string | null;
  /** the data is exactly `[DONE]` */
  done: boolean;
}

const LF = 0x0a;
const CR = 0x0d;
const COLON = 0x3a;
const SPACE = 0x20;
const DONE = "[DONE]";
/** bytes kept of a field name, an `event:` value, a data head or a JSON "type" value: beyond, they are not what we look for */
const SHORT = 128;

type Field = "event" | "data" | "other";

/**
 * Incremental SSE scanner. `feed` the bytes as they come, `end` once the stream ended cleanly;
 * `onEvent` is called for every complete event. `typed`: also find a data-only event's type in
 * its JSON (a byte scan of its data; events with an `event:` line never need it).
 */
export class SseScanner {
  /** bytes of the current line so far (0: the line is empty so far) */
  private lineBytes = 0;
  /** the previous byte was a CR: a LF right after it ends nothing more */
  private afterCR = false;
  private field: Field | null = null;
  private name: number[] = [];
  private skipSpace = false;
  private value: number[] = [];
  // the event being read
  private eventType: string | null = null;
  private dataLines = 0;
  private dataBytes = 0;
  private dataHead: number[] = [];
  private json: JsonTypeScan | null = null;

  constructor(
    private readonly onEvent: (e: SseEventInfo) => void,
    private readonly typed = false,
  ) {}

  feed(bytes: Uint8Array): void {
    const n = bytes.length;
    /** where the next CR is (n: none): looked up once a feed, not once a line */
    let cr = -1;
    let i = 0;
    while (i < n) {
      const b = bytes[i]!;
      if (b === LF || b === CR) {
        const crlf = b === LF && this.afterCR;
        this.afterCR = b === CR;
        i++;
        if (!crlf) this.endLine();
        continue;
      }
      this.afterCR = false;
      if ((this.field === "data" || this.field === "other") && !this.skipSpace) {
        // a value that is only counted (data) or ignored: jump to the line's end
        if (cr < i) cr = indexOrEnd(bytes, CR, i);
        const j = Math.min(indexOrEnd(bytes, LF, i), cr);
        if (this.field === "data") this.dataValue(bytes, i, j);
        this.lineBytes += j - i;
        i = j;
        continue;
      }
      this.lineBytes++;
      i++;
      if (this.field === null) {
        if (b === COLON) {
          this.field = this.lineBytes === 1 ? "other" : fieldOf(this.name);
          this.skipSpace = true;
          if (this.field === "data") this.startData();
        } else if (this.name.length < SHORT) this.name.push(b);
        continue;
      }
      if (this.skipSpace) {
        this.skipSpace = false;
        if (b === SPACE) continue;
      }
      if (this.field === "data") this.dataValue(bytes, i - 1, i);
      else if (this.field === "event" && this.value.length < SHORT) this.value.push(b);
    }
  }

  /** The stream ended cleanly. An event not closed by a blank line is dropped, except a bare `[DONE]`. */
  end(): void {
    if (this.field === null && this.lineBytes > 0 && this.name.length) {
      // a last line without a colon: a field with an empty value
      this.field = fieldOf(this.name);
      if (this.field === "data") this.startData();
    }
    if (this.dataLines > 0 && this.dataDone()) this.onEvent({ type: this.eventType, done: true });
  }

  private startData(): void {
    if (this.dataLines > 0) this.dataValueByte(LF);
    this.dataLines++;
    if (this.typed && this.eventType === null && this.json === null) this.json = new JsonTypeScan();
  }

  private dataValue(bytes: Uint8Array, from: number, to: number): void {
    for (let k = from; k < to && this.dataHead.length < SHORT; k++) this.dataHead.push(bytes[k]!);
    this.dataBytes += to - from;
    if (this.json) for (let k = from; k < to; k++) this.json.byte(bytes[k]!);
  }

  private dataValueByte(b: number): void {
    if (this.dataHead.length < SHORT) this.dataHead.push(b);
    this.dataBytes++;
    this.json?.byte(b);
  }

  private dataDone(): boolean {
    return this.dataBytes <= SHORT && ascii(this.dataHead).trim() === DONE;
  }

  private endLine(): void {
    if (this.lineBytes === 0) {
      this.dispatch();
    } else {
      if (this.field === null) {
        // a line without a colon is a field with an empty value
        this.field = fieldOf(this.name);
        if (this.field === "data") this.startData();
      }
      if (this.field === "event") this.eventType = ascii(this.value);
    }
    this.lineBytes = 0;
    this.field = null;
    this.name = [];
    this.value = [];
    this.skipSpace = false;
  }

  private dispatch(): void {
    if (this.dataLines > 0) {
      const type = this.eventType ?? this.json?.result() ?? null;
      this.onEvent({ type, done: this.dataDone() });
    }
    this.eventType = null;
    this.dataLines = 0;
    this.dataBytes = 0;
    this.dataHead = [];
    this.json = null;
  }
}

function indexOrEnd(bytes: Uint8Array, b: number, from: number): number {
  const at = bytes.indexOf(b, from);
  return at < 0 ? bytes.length : at;
}

function fieldOf(name: number[]): Field {
  const s = ascii(name);
  return s === "event" ? "event" : s === "data" ? "data" : "other";
}

function ascii(bytes: number[]): string {
  return new TextDecoder().decode(new Uint8Array(bytes));
}

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const TYPE_KEY = [0x74, 0x79, 0x70, 0x65]; // "type"

/**
 * The top-level "type" member of one JSON object, read byte by byte in constant memory: null
 * unless the object is complete (a cut JSON text has no type) and that member is a string.
 */
export class JsonTypeScan {
  private depth = 0;
  private inString = false;
  private escaped = false;
  /** at depth 1: the next string is a key */
  private expectKey = false;
  /** at depth 1: after a key's colon, before its value */
  private expectValue = false;
  private stringIsKey = false;
  private stringIsTypeValue = false;
  private buf: number[] = [];
  private overflow = false;
  private lastKeyIsType = false;
  private type: string | null = null;
  private complete = false;
  private invalid = false;

  byte(b: number): void {
    if (this.invalid) return;
    if (this.inString) {
      if (this.escaped) this.escaped = false;
      else if (b === BACKSLASH) {
        this.escaped = true;
        // an escaped key or value is never the plain "type" we look for
        this.overflow = true;
      } else if (b === QUOTE) {
        this.inString = false;
        if (this.stringIsKey) this.lastKeyIsType = !this.overflow && this.buf.length === 4 && this.buf.every((c, k) => c === TYPE_KEY[k]);
        else if (this.stringIsTypeValue && !this.overflow) this.type = new TextDecoder().decode(new Uint8Array(this.buf));
        return;
      }
      if ((this.stringIsKey || this.stringIsTypeValue) && !this.overflow) {
        if (this.buf.length < SHORT) this.buf.push(b);
        else this.overflow = true;
      }
      return;
    }
    if (this.complete) {
      if (b !== SPACE && b !== LF && b !== CR && b !== 0x09) this.invalid = true;
      return;
    }
    switch (b) {
      case QUOTE:
        this.inString = true;
        this.buf = [];
        this.overflow = false;
        this.stringIsKey = this.depth === 1 && this.expectKey;
        this.stringIsTypeValue = this.depth === 1 && this.expectValue && this.lastKeyIsType;
        this.expectKey = false;
        this.expectValue = false;
        return;
      case 0x7b: // {
      case 0x5b: // [
        if (this.depth === 0 && b !== 0x7b) this.invalid = true;
        this.expectValue = false;
        this.depth++;
        this.expectKey = this.depth === 1;
        return;
      case 0x7d: // }
      case 0x5d: // ]
        this.depth--;
        if (this.depth === 0) this.complete = true;
        else if (this.depth < 0) this.invalid = true;
        return;
      case 0x2c: // ,
        if (this.depth === 1) this.expectKey = true;
        return;
      case COLON:
        if (this.depth === 1) this.expectValue = true;
        return;
      case SPACE:
      case LF:
      case CR:
      case 0x09:
        return;
      default:
        // a number, true, false or null: a value, not the string we look for
        if (this.depth === 0) this.invalid = true;
        this.expectValue = false;
    }
  }

  result(): string | null {
    return this.complete && !this.invalid ? this.type : null;
  }
}

/** What a complete stream ends with: `data: [DONE]` (chat, completions, /generate), or one of these event types (Responses). */
export type Completeness = { kind: "done" } | { kind: "events"; types: readonly string[] };

/** Judges, event by event, whether a stream reached its end: seen `[DONE]`, or an end event. */
export class CompletenessJudge {
  private complete = false;
  private readonly scanner: SseScanner;

  constructor(readonly rule: Completeness) {
    this.scanner = new SseScanner((e) => {
      if (rule.kind === "done" ? e.done : e.type !== null && rule.types.includes(e.type)) this.complete = true;
    }, rule.kind === "events");
  }

  feed(bytes: Uint8Array): void {
    if (!this.complete) this.scanner.feed(bytes);
  }

  /** The stream ended cleanly: was it complete? */
  end(): boolean {
    if (!this.complete) this.scanner.end();
    return this.complete;
  }
}
