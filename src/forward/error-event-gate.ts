// An engine that fails after it sent a stream's headers says so inside the stream: an SSE event
// whose data is an error object, then `data: [DONE]`.
// - vLLM: `data: {"error": {"message", "type", "param", "code"}}` (chat_completion/serving.py,
//   completion/serving.py: `except GenerationError` — a request whose engine output finished
//   with reason "error", code 500 — and `except Exception` -> `create_streaming_error_response`,
//   whose code follows the exception: 400 for a ValueError, 501 for a NotImplementedError, 500
//   else; vllm entrypoints/openai/engine/serving.py). Older releases wrote
//   `{"error": {"object": "error", "message", ...}}`, same member.
// - SGLang: the same member (entrypoints/openai/serving_base.py `create_streaming_error_response`,
//   code = the HTTP status): serving_chat.py / serving_completions.py write it when the scheduler
//   aborted the request (`finish_reason.type == "abort"` with its status_code: 500 when a decode
//   node's KV transfer failed, disaggregation/decode.py `prepare_abort(...,
//   INTERNAL_SERVER_ERROR)`; 400 for a request it found invalid) and for a ValueError (400). Its
//   native /generate writes `{"error": {"message"}}` without a code, for a ValueError only (the
//   request's validation): the client's.
// - The Responses API's error event: `event: error`, data `{"type": "error", "code", "message"}`.
// The gate finds such an event as the bytes pass and cuts the stream at its start: the engine's
// error event and whatever follows it ([DONE]) never reach the client, who gets the router's own
// error event instead. It holds back only the opening bytes of an event until it can tell (the
// first bytes of its first data line, at most HOLD_MAX_BYTES), so large events still flow as
// they come.

/** What an engine said when it reported an error inside its stream. */
export interface EngineError {
  /** its message (at most 300 characters) */
  message: string;
  /** the HTTP status it gave the error (its `code`), when it gave one */
  status: number | null;
  /** it was the stream's first event: nothing of the answer had been sent */
  first: boolean;
}

export interface GateRead {
  /** bytes that may go on to the client */
  pass: Uint8Array;
  /** the stream carried an error event: set once its data is read (nothing after its start passes) */
  error: EngineError | null;
}

const LF = 0x0a;
const CR = 0x0d;
/** bytes of a line kept to tell its field and, for data, whether it opens an error object */
const HEAD_BYTES = 64;
/** an event still undecided after this many bytes (long comments, many fields before its data) is not an error */
export const HOLD_MAX_BYTES = 4096;
/** bytes of an error event's data read for its message */
const ERROR_TEXT_MAX = 4096;
const EMPTY = new Uint8Array(0);

/** data that opens an error object: `{"error": {...}` or `"..."`, or a Responses error event `{"type": "error"` */
const ERROR_DATA = /^\s*\{\s*(?:"error"\s*:\s*[{"]|"type"\s*:\s*"error")/;

type Verdict = "pending" | "plain" | "error";

/**
 * Incremental: `feed` each chunk as it comes and send on what it passes; `end` once the stream
 * ended cleanly. After an error event began nothing more passes; `error` is reported once its
 * event is read (its first data line, or ERROR_TEXT_MAX bytes, or the stream's end).
 */
export class ErrorEventGate {
  private afterCR = false;
  /** bytes of the current line so far */
  private lineBytes = 0;
  private head: number[] = [];
  /** the current event has begun (a non-empty line since the last blank one) */
  private inEvent = false;
  private verdict: Verdict = "plain";
  private eventHasData = false;
  /** bytes of the undecided event held back (views of the chunks fed) */
  private held: Uint8Array[] = [];
  private heldBytes = 0;
  /** events that carried data and passed */
  private passedEvents = 0;
  /** the first data-carrying event was found not to be an error */
  private settledFirst = false;
  // the error event, once one began
  private cut = false;
  private cutFirst = false;
  private errorRaw = "";
  private errorDone = false;
  private reported = false;
  private readonly decoder = new TextDecoder();
  // the chunk being fed: its bytes not yet routed begin at `from`
  private chunk: Uint8Array = EMPTY;
  private from = 0;
  private out = new Output();

  /** The stream's first data-carrying event is known not to be an error (the status line may go out). */
  get firstSettled(): boolean {
    return this.settledFirst;
  }

  feed(bytes: Uint8Array): GateRead {
    if (this.reported) return { pass: EMPTY, error: null };
    this.chunk = bytes;
    this.from = 0;
    this.out = new Output();
    const n = bytes.length;
    let cr = -1;
    let i = 0;
    while (i < n) {
      const b = bytes[i]!;
      if (b === LF || b === CR) {
        const crlf = b === LF && this.afterCR;
        this.afterCR = b === CR;
        i++;
        if (crlf) continue;
        this.route(i);
        if (this.lineBytes === 0) {
          // a blank line ends the event
          if (this.inEvent) this.endEvent();
        } else this.endLine(i);
        continue;
      }
      this.afterCR = false;
      if (this.lineBytes === 0 && !this.inEvent) {
        this.route(i);
        this.inEvent = true;
        this.verdict = this.cut ? "error" : "pending";
      }
      // the line's content up to its end (or the chunk's): only its head is looked at
      if (cr < i) cr = indexOrEnd(bytes, CR, i);
      const end = Math.min(indexOrEnd(bytes, LF, i), cr);
      for (let k = i; k < end && this.head.length < HEAD_BYTES; k++) this.head.push(bytes[k]!);
      this.lineBytes += end - i;
      i = end;
      if (this.verdict === "pending" && this.head.length >= HEAD_BYTES && this.fieldOfHead() === "data") {
        this.eventHasData = true;
        this.decide(i, this.dataOpensError() ? "error" : "plain");
      }
      if (this.verdict === "pending" && this.heldBytes + (i - this.from) > HOLD_MAX_BYTES) this.decide(i, "plain");
    }
    this.route(n);
    return { pass: this.out.bytes(), error: this.errorIfDone() };
  }

  /** The stream ended cleanly: what was held back passes (an unfinished event is not one), and an error event is reported. */
  end(): GateRead {
    if (this.reported) return { pass: EMPTY, error: null };
    // an undecided last event opening an error object: an error cut short
    if (this.inEvent && this.verdict === "pending" && this.fieldOfHead() === "data" && this.dataOpensError()) {
      this.chunk = EMPTY;
      this.from = 0;
      this.decide(0, "error");
    }
    if (this.cut) {
      this.errorDone = true;
      return { pass: EMPTY, error: this.errorIfDone() };
    }
    this.out = new Output();
    for (const h of this.held) this.out.push(h);
    this.held = [];
    return { pass: this.out.bytes(), error: null };
  }

  /** Sends the chunk's bytes up to `to` where they go now: on, held back, or (the error event and after) into the error's text. */
  private route(to: number): void {
    if (to <= this.from) return;
    const part = this.chunk.subarray(this.from, to);
    this.from = to;
    if (this.cut) {
      if (!this.errorDone && this.errorRaw.length < ERROR_TEXT_MAX) this.errorRaw += this.decoder.decode(part.subarray(0, ERROR_TEXT_MAX), { stream: true });
    } else if (this.inEvent && this.verdict === "pending") {
      this.held.push(part);
      this.heldBytes += part.byteLength;
    } else this.out.push(part);
  }

  private decide(at: number, verdict: "plain" | "error"): void {
    this.route(at);
    if (verdict === "plain") {
      for (const h of this.held) this.out.push(h);
      if (this.eventHasData || this.fieldOfHead() === "event") this.settledFirst = true;
    } else {
      this.cut = true;
      this.cutFirst = this.passedEvents === 0;
      // the event so far is the start of the error's text
      for (const h of this.held) this.errorRaw += this.decoder.decode(h, { stream: true });
    }
    this.held = [];
    this.heldBytes = 0;
    this.verdict = verdict;
  }

  private endLine(at: number): void {
    const field = this.fieldOfHead();
    if (this.verdict === "pending") {
      if (field === "event") {
        this.decide(at, this.valueOfHead() === "error" ? "error" : "plain");
      } else if (field === "data") {
        this.eventHasData = true;
        this.decide(at, this.dataOpensError() ? "error" : "plain");
        // a one-line error event is read whole
        if (this.cut) this.errorDone = true;
      }
      // other fields (id, retry, comments) decide nothing
    } else if (field === "data") {
      this.eventHasData = true;
      // the error event's first data line is in: that is its message
      if (this.cut) this.errorDone = true;
    }
    this.lineBytes = 0;
    this.head = [];
  }

  private endEvent(): void {
    // an event without data (a comment, a keep-alive) is no event: it passes
    if (this.verdict === "pending") this.decide(this.from, "plain");
    if (this.verdict === "plain" && this.eventHasData) this.passedEvents++;
    if (this.cut) this.errorDone = true;
    this.inEvent = false;
    this.eventHasData = false;
  }

  private fieldOfHead(): "data" | "event" | "other" | null {
    const colon = this.head.indexOf(0x3a);
    if (colon < 0) return this.head.length >= HEAD_BYTES ? "other" : null;
    const name = ascii(this.head.slice(0, colon));
    return name === "data" ? "data" : name === "event" ? "event" : "other";
  }

  private valueOfHead(): string {
    const colon = this.head.indexOf(0x3a);
    return ascii(this.head.slice(colon + 1)).replace(/^ /, "");
  }

  private dataOpensError(): boolean {
    return ERROR_DATA.test(this.valueOfHead());
  }

  private errorIfDone(): EngineError | null {
    if (!this.cut || this.reported || !(this.errorDone || this.errorRaw.length >= ERROR_TEXT_MAX)) return null;
    this.reported = true;
    const raw = this.errorRaw + this.decoder.decode();
    // the data of the event's data lines (the `event:` line, if any, is not part of it)
    const data = raw
      .split(/\r\n|\r|\n/)
      .filter((l) => l.startsWith("data:"))
      .map((l) => l.slice(l.startsWith("data: ") ? 6 : 5))
      .join("\n");
    return { ...engineErrorOf(data), first: this.cutFirst };
  }
}

/** The message and status of an error event's data (cut or not). */
export function engineErrorOf(data: string): Omit<EngineError, "first"> {
  let message: unknown;
  let code: unknown;
  try {
    const event = JSON.parse(data) as { error?: unknown; type?: unknown; message?: unknown; code?: unknown };
    const error = event.error;
    if (typeof error === "string") message = error;
    else if (error && typeof error === "object") ({ message, code } = error as { message?: unknown; code?: unknown });
    else if (event.type === "error") ({ message, code } = event);
  } catch {
    // cut at ERROR_TEXT_MAX: read what can be read
    const m = /"message"\s*:\s*"((?:[^"\\]|\\.)*)"/.exec(data);
    if (m) {
      try {
        message = JSON.parse(`"${m[1]}"`);
      } catch {
        message = m[1];
      }
    }
    code = /"code"\s*:\s*"?(\d{3})\b/.exec(data)?.[1];
  }
  const status = typeof code === "number" || (typeof code === "string" && /^\d{3}$/.test(code)) ? Number(code) : null;
  const text = typeof message === "string" && message ? message : "the engine reported an error";
  return { message: text.length > 300 ? `${text.slice(0, 300)}...` : text, status: status !== null && status >= 400 && status <= 599 ? status : null };
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
    if (this.parts.length <= 1) return this.parts[0] ?? EMPTY;
    const out = new Uint8Array(this.parts.reduce((n, p) => n + p.byteLength, 0));
    let at = 0;
    for (const p of this.parts) {
      out.set(p, at);
      at += p.byteLength;
    }
    return out;
  }
}

function indexOrEnd(bytes: Uint8Array, b: number, from: number): number {
  const at = bytes.indexOf(b, from);
  return at < 0 ? bytes.length : at;
}

const headDecoder = new TextDecoder();

function ascii(bytes: number[]): string {
  return headDecoder.decode(new Uint8Array(bytes));
}
