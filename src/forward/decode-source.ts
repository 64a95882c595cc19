import { sseErrorEvent, type ErrorType } from "../errors";
import type { LegReport } from "../state/types";
import type { EngineError } from "./engine-error";
import { joinBytes, MAX_DATA_LINE_BYTES, sseReader, type Completeness, type SseReader, type DataRewrite, type SseRead } from "./sse-reader";
import { redact, statusOutcome, type Leg, type UpstreamFailure } from "./upstream";

/**
 * How a relayed stream ended. `failure` names whose failure it was: D's own (counted against D),
 * P's when P failed after D's first byte (counted against P; D's leg was only aborted), the
 * client's (D reported the request invalid or unsupported inside its stream: counted against
 * nobody), a busy D's (not counted), or nobody's (another prompt of a batch failed). `status`:
 * what the log line says the client got, when not 502.
 */
export type StreamEnd =
  | { outcome: "ok" }
  | { outcome: "failure"; error: string; timeout: boolean; blame: "decode" | "prefill" | "client" | "busy" | "none"; prefill?: LegReport; status?: number }
  | { outcome: "aborted"; error: string }
  | { outcome: "stalled"; error: string };

/** One read of a source: D's next bytes (rewritten where they must be), or how the stream ended. */
export type SourceRead =
  | { done: false; bytes: Uint8Array }
  /** `bytes`: what D sent last (a held line); `error`: the SSE error event to end the client's stream with, or none */
  | { done: true; end: StreamEnd; bytes: Uint8Array; error: Uint8Array };

export interface DecodeSourceOptions {
  leg: Leg;
  reader: ReadableStreamDefaultReader<Uint8Array>;
  /** D's first body bytes, already read (the status line waited for them) */
  first: Uint8Array;
  /** D's data lines as the client must see them (its usage from P's counts), or null */
  rewrite: DataRewrite | null;
  /** sees every byte that goes on to the client (a Responses stream's id) */
  watch?: (bytes: Uint8Array) => void;
  /** longest silence from D between body bytes while the client waits */
  idleMs: number;
  /** what a complete stream ends with; a stream that ends cleanly without it was cut */
  completeness: Completeness;
  /** sglang, vllm-mooncake: P's failure, once P failed after D's first byte (D's leg was aborted for it) */
  partnerFailure?: () => UpstreamFailure | null;
  /** called once, however the stream ends */
  onEnd(end: StreamEnd): void;
}

const EMPTY = new Uint8Array(0);
const encoder = new TextEncoder();

type Failure = StreamEnd & { outcome: "failure" };

/** The stream's end as a failure: how the log line tells it, and the error event that ends the client's stream. */
const failed = (bytes: Uint8Array, end: Omit<Failure, "outcome" | "timeout"> & { timeout?: boolean }, message: string, code: string, type?: ErrorType): SourceRead => ({
  done: true,
  end: { outcome: "failure", timeout: false, ...end },
  bytes,
  error: encoder.encode(sseErrorEvent(message, code, type)),
});

/** The stream's end when nothing more goes to the client. */
const endedWith = (end: StreamEnd): SourceRead => ({ done: true, end, bytes: EMPTY, error: EMPTY });

/** D's stream as a source of client bytes. */
export interface DecodeSource {
  /** D's node id */
  readonly node: string;
  /** D's data lines are rewritten further, after the source's own rewrite (a batch renumbers them). Before the first read. */
  rewriteAlso(next: DataRewrite): void;
  /** D's next bytes, or how its stream ended. */
  next(): Promise<SourceRead>;
  /** The watchdog's tick: D silent for idleMs while a read waits fails the read as idle. */
  checkIdle(now: number): void;
  /** The consumer stops: D's leg is closed and the stream ends with `end` (unless it ended already). */
  cancel(end: StreamEnd): void;
  /** Reports how the stream ended, once; D's leg is done. */
  end(end: StreamEnd): void;
}

/**
 * D's SSE body, pulled one chunk at a time by whoever writes to the client (one stream's relay,
 * or a batch's merge): nothing is read from D before the client wants more, so a client that
 * stops reading stops D's connection too (TCP backpressure) instead of filling the isolate.
 * It watches D — silent for `idleMs` while a read waits, a clean end before the stream was
 * complete, a broken body, P failing under it — and turns each into an error event and a
 * failure; `cancel` closes D's leg when the consumer stops (the client left, stalled, or a
 * batch failed). `end` reports exactly once.
 */
export function decodeSource(o: DecodeSourceOptions): DecodeSource {
  const { leg, reader, completeness: rule } = o;
  const node = leg.node;
  let first: Uint8Array | null = o.first;
  /** reads D's events: its error event (kept from the client), completeness, the lines to rewrite */
  let sse: SseReader = sseReader(rule, o.rewrite);
  /** when D last gave a chunk (or the relay began) */
  let lastChunkAt = Date.now();
  /** a read from D is pending */
  let reading = false;
  let idle = false;
  /** the consumer cancelled: every later read answers this */
  let cancelled: StreamEnd | null = null;
  let ended = false;

  /** The rest of D's answer is not wanted. */
  const stopLeg = (why: string) => leg.abort(why);

  /** sglang, vllm-mooncake: P failed after D's first byte (and D's leg was aborted for it, or D reported the transfer failed): P's failure. */
  const partnerFailed = (bytes: Uint8Array, said?: string): SourceRead | null => {
    const partner = o.partnerFailure?.();
    if (!partner) return null;
    const error = said ? `${partner.message}; ${said}` : partner.message;
    return failed(bytes, { blame: "prefill", timeout: partner.kind === "timeout", error, prefill: partner.report() }, "the prefill node failed", "upstream_prefill_failed");
  };

  /**
   * D reported an error inside its stream after the answer began (an error as the first event
   * never gets here: the status line waits for it, and the request fails over; pipeline.ts). The
   * client's stream ends with the router's error event instead of D's, never [DONE]; whose fault
   * it was follows the status D gave it, as for a status line (upstream.ts `statusOutcome`), or
   * P's when P failed meanwhile (sglang, vllm-mooncake).
   */
  const engineFailed = (err: EngineError, bytes: Uint8Array): SourceRead => {
    // the rest of D's answer (its [DONE]) is not wanted
    stopLeg("error event");
    const reason = redact(err.message, leg.call.node.access.secrets);
    const error = `decode node ${node} sent an error event${err.status ? ` (HTTP ${err.status})` : ""}: ${reason}`;
    // no status: SGLang's native /generate, which writes one only for a ValueError (the request's validation)
    const status = err.status ?? 400;
    const outcome = statusOutcome(status, "engine");
    return (
      partnerFailed(bytes, error) ??
      (outcome === "client_error"
        ? failed(bytes, { blame: "client", error, status }, reason, "upstream_rejected", "invalid_request_error")
        : outcome === "busy"
          ? failed(bytes, { blame: "busy", error, status: 503 }, "the decode node is busy", "upstream_busy")
          : failed(bytes, { blame: "decode", error }, "the decode node reported an error", "upstream_stream_error"))
    );
  };

  /** What the reader let through, or how the stream ended: an error event in it, a line too long to rewrite, or (`done`) complete or cut. */
  const passed = (read: SseRead, done: boolean): SourceRead => {
    const bytes = read.pass;
    o.watch?.(bytes);
    if (read.error) return engineFailed(read.error, bytes);
    if (sse.tooLong) {
      stopLeg("line too long");
      const error = `decode node ${node} sent an event over ${MAX_DATA_LINE_BYTES} bytes`;
      return failed(bytes, { blame: "none", error }, "an event too large for a batched stream", "batch_event_too_large");
    }
    if (!done) return { done, bytes };
    if (sse.complete) return { done, end: { outcome: "ok" }, bytes, error: EMPTY };
    const error = `decode node ${node} ended its stream without ${rule.kind === "done" ? "data: [DONE]" : rule.types.join(" or ")}`;
    return failed(bytes, { blame: "decode", error }, "the decode node's stream ended incomplete", "upstream_stream_incomplete");
  };

  const readFailed = (err: unknown): SourceRead => {
    if (cancelled) return endedWith(cancelled);
    // P failed after D's first byte and D's leg was aborted for it: not the client leaving
    const partner = partnerFailed(EMPTY);
    if (partner) return partner;
    if (idle)
      return failed(
        EMPTY,
        { blame: "decode", timeout: true, error: `decode node ${node} sent nothing for ${o.idleMs} ms` },
        "the decode node stopped sending",
        "upstream_idle_timeout",
      );
    if (leg.requestEnded) return endedWith({ outcome: "aborted", error: "client disconnected" });
    return failed(EMPTY, { blame: "decode", error: `decode stream failed: ${(err as Error)?.message ?? String(err)}` }, "the decode node failed", "upstream_stream_error");
  };

  const source: DecodeSource = {
    node,
    rewriteAlso(next) {
      const own = o.rewrite;
      const line = (v: string) => {
        const mine = own ? own.line(v) : v;
        return mine === null ? null : next.line(mine);
      };
      sse = sseReader(rule, { line, required: next.required });
    },
    async next() {
      const bytes = first;
      first = null;
      if (bytes) return passed(sse.feed(bytes), false);
      if (cancelled) return endedWith(cancelled);
      let chunk: ReadableStreamReadResult<Uint8Array>;
      reading = true;
      try {
        chunk = await reader.read();
      } catch (err) {
        return readFailed(err);
      } finally {
        reading = false;
      }
      lastChunkAt = Date.now();
      if (cancelled) return endedWith(cancelled);
      // the leg was stopped under the read (its body cancelled, Leg.bodyReader): not D's end
      if (chunk.done && leg.stopped) return readFailed(new Error(leg.stopped));
      return chunk.done ? passed(sse.end(), true) : passed(sse.feed(chunk.value), false);
    },
    checkIdle(now) {
      if (reading && !idle && !ended && now - lastChunkAt > o.idleMs) {
        idle = true;
        leg.abort("decode idle timeout");
      }
    },
    cancel(end) {
      if (ended) return;
      cancelled = end;
      stopLeg(end.outcome === "failure" ? "batch failed" : "client went away");
      source.end(end);
    },
    end(end) {
      if (ended) return;
      ended = true;
      leg.close();
      o.onEnd(end);
    },
  };
  return source;
}

/** Bytes of D's stream read at most before the status line goes out, when its first event is still undecided. */
export const FIRST_EVENT_MAX_BYTES = 64 * 1024;
/**
 * The same while a Responses preamble is read: `response.created` and `response.in_progress` each
 * echo the request's instructions and tools (an agent's can be tens of KB); past this the answer
 * goes out before D's first output, as it did before the preamble was waited for.
 */
export const PREAMBLE_MAX_BYTES = 256 * 1024;

/**
 * The events a vLLM Responses stream sends as soon as the request is accepted, before its engine
 * has produced anything (vllm/entrypoints/openai/responses/serving.py responses_stream_generator
 * yields them before it reads the result generator; the item events follow the first output).
 */
export const RESPONSES_PREAMBLE: readonly string[] = ["response.created", "response.in_progress"];

/**
 * An SSE event's type: its `event:` line, else its data's Responses `"type"` (a `response.` one: the
 * response object an event carries holds nested types, `text.format.type` among them, and may come
 * before the event's own), else its first; "" for data without one, null for a comment.
 */
export function eventTypeOf(block: string): string | null {
  const named = /^event:[ ]?(.*)$/m.exec(block);
  if (named) return named[1]!.trim();
  if (!/^data:/m.test(block)) return null;
  const types = [...block.matchAll(/"type"\s*:\s*"([^"]*)"/g)].map((m) => m[1]!);
  return types.find((t) => t.startsWith("response.")) ?? types[0] ?? "";
}

/**
 * Reads a stream's text as it comes and answers whether a whole event of a type other than
 * `preamble` has been read. Each event is looked at once, when it is complete, and dropped: a
 * Responses preamble echoes the request's instructions and tools (hundreds of KB for an agent),
 * and re-reading all of it at every chunk cost 54 ms of CPU for 230 KB in 1 KB chunks.
 */
export function preambleScan(preamble: readonly string[]): (chunk: string) => boolean {
  /** the text after the last whole event, in pieces (joined only once its event is whole), line breaks as LF */
  let rest: string[] = [];
  let restEndsLf = false;
  /** the last chunk ended in CR: the LF of a CRLF may begin the next */
  let cr = false;
  return (chunk) => {
    let text = cr ? `\r${chunk}` : chunk;
    cr = text.endsWith("\r");
    if (cr) text = text.slice(0, -1);
    text = text.replace(/\r\n?/g, "\n");
    if (!text) return false;
    const ends = text.includes("\n\n") || (restEndsLf && text[0] === "\n");
    restEndsLf = text.endsWith("\n");
    rest.push(text);
    if (!ends) return false;
    const blocks = rest.join("").split("\n\n");
    // the last block is unfinished (empty when the text ends an event)
    rest = [blocks.pop()!];
    return blocks.some((block) => {
      const type = eventTypeOf(block);
      return type !== null && !preamble.includes(type);
    });
  };
}

/**
 * Reads D's stream until its first event is known not to be an error: the status line waits for
 * it (it is in D's first bytes: engines write an event whole), so an error D reports as its first
 * event — SGLang's decode whose KV transfer failed, vLLM's request that failed in the engine —
 * reached nobody and fails over like a refused request (Leg.errorEventFailure). Each read after
 * the first byte is bounded by `idleMs`; after FIRST_EVENT_MAX_BYTES of comments the answer goes
 * out anyway. Returns the bytes read, which the DecodeSource relays first.
 * Events of `preamble` types (a Responses stream's: RESPONSES_PREAMBLE) do not count as the first:
 * they come before D has pulled any KV or produced a token, so the status line, the failover
 * window and the time to first token all wait for the event after them.
 */
export async function readFirstEvent(leg: Leg, reader: ReadableStreamDefaultReader<Uint8Array>, idleMs: number, preamble: readonly string[] = []): Promise<Uint8Array> {
  const sse = sseReader({ kind: "done" });
  const parts: Uint8Array[] = [];
  let bytes = 0;
  // the preamble: passed once a whole event of another type was read
  let past = preamble.length === 0;
  const scan = preambleScan(preamble);
  const decoder = new TextDecoder();
  for (;;) {
    let read: ReadableStreamReadResult<Uint8Array>;
    try {
      read = await reader.read();
    } catch (err) {
      throw leg.failure(err, "broken", bytes ? "broke off its stream in its first event" : "broke off its stream before the first byte");
    }
    if (read.done) {
      if (leg.stopped) throw leg.failure(new Error(leg.stopped), "broken", bytes ? "broke off its stream in its first event" : "broke off its stream before the first byte");
      if (!bytes) throw leg.protocolFailure("ended its stream without a byte");
      const last = sse.end();
      if (last.error) throw leg.errorEventFailure(last.error);
      break;
    }
    if (!read.value.byteLength) continue;
    // the first byte is in: D's silences are bounded by decodeIdleMs from here (while a preamble
    // is read, D's first output is still due within the first byte's time, decodeFirstByteMs)
    if (past) leg.deadline(idleMs, `sent nothing for ${idleMs} ms inside its first event`);
    parts.push(read.value);
    bytes += read.value.byteLength;
    const g = sse.feed(read.value);
    if (g.error) throw leg.errorEventFailure(g.error);
    if (!past) past = scan(decoder.decode(read.value, { stream: true }));
    if ((sse.settled && past) || bytes >= (past ? FIRST_EVENT_MAX_BYTES : PREAMBLE_MAX_BYTES)) break;
  }
  leg.clearDeadline();
  return joinBytes(parts);
}
