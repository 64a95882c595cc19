import { sseErrorEvent } from "../errors";
import type { LegReport } from "../state/types";
import { concat } from "./client-stream";
import type { EngineError } from "./engine-error";
import { MAX_DATA_LINE_BYTES, SseReader, type Completeness, type DataRewrite, type SseRead } from "./sse-reader";
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

/**
 * D's SSE body, pulled one chunk at a time by whoever writes to the client (one stream's relay,
 * or a batch's merge): nothing is read from D before the client wants more, so a client that
 * stops reading stops D's connection too (TCP backpressure) instead of filling the isolate.
 * It watches D — silent for `idleMs` while a read waits, a clean end before the stream was
 * complete, a broken body, P failing under it — and turns each into an error event and a
 * failure; `cancel` closes D's leg when the consumer stops (the client left, stalled, or a
 * batch failed). `end` reports exactly once.
 */
export class DecodeSource {
  private first: Uint8Array | null;
  /** reads D's events: its error event (kept from the client), completeness, the lines to rewrite */
  private sse: SseReader;
  /** when D last gave a chunk (or the relay began) */
  private lastChunkAt = Date.now();
  /** a read from D is pending */
  private reading = false;
  private idle = false;
  /** the consumer cancelled: every later read answers this */
  private cancelled: StreamEnd | null = null;
  private ended = false;

  constructor(private readonly o: DecodeSourceOptions) {
    this.first = o.first;
    this.sse = new SseReader(o.completeness, o.rewrite);
  }

  get node(): string {
    return this.o.leg.node;
  }

  /** D's data lines are rewritten further, after the source's own rewrite (a batch renumbers them). Before the first read. */
  rewriteAlso(next: DataRewrite): void {
    const own = this.o.rewrite;
    this.sse = new SseReader(
      this.o.completeness,
      own
        ? {
            line: (v) => {
              const line = own.line(v);
              return line === null ? null : next.line(line);
            },
            required: next.required,
          }
        : next,
    );
  }

  async next(): Promise<SourceRead> {
    if (this.first) {
      const first = this.first;
      this.first = null;
      return this.passed(this.sse.feed(first), false);
    }
    if (this.cancelled) return { done: true, end: this.cancelled, bytes: EMPTY, error: EMPTY };
    let chunk: ReadableStreamReadResult<Uint8Array>;
    this.reading = true;
    try {
      chunk = await this.o.reader.read();
    } catch (err) {
      return this.readFailed(err);
    } finally {
      this.reading = false;
    }
    this.lastChunkAt = Date.now();
    if (this.cancelled) return { done: true, end: this.cancelled, bytes: EMPTY, error: EMPTY };
    return chunk.done ? this.passed(this.sse.end(), true) : this.passed(this.sse.feed(chunk.value), false);
  }

  /** The watchdog's tick: D silent for idleMs while a read waits fails the read as idle. */
  checkIdle(now: number): void {
    if (this.reading && !this.idle && !this.ended && now - this.lastChunkAt > this.o.idleMs) {
      this.idle = true;
      this.o.leg.abort("decode idle timeout");
    }
  }

  /** The consumer stops: D's leg is closed and the stream ends with `end` (unless it ended already). */
  cancel(end: StreamEnd): void {
    if (this.ended) return;
    this.cancelled = end;
    this.o.leg.abort(end.outcome === "failure" ? "batch failed" : "client went away");
    this.o.reader.cancel().catch(() => undefined);
    this.end(end);
  }

  /** Reports how the stream ended, once; D's leg is done. */
  end(end: StreamEnd): void {
    if (this.ended) return;
    this.ended = true;
    this.o.leg.close();
    this.o.onEnd(end);
  }

  get isEnded(): boolean {
    return this.ended;
  }

  /** What the reader let through, or how the stream ended: an error event in it, a line too long to rewrite, or (`ended`) complete or cut. */
  private passed(read: SseRead, ended: boolean): SourceRead {
    const bytes = read.pass;
    this.o.watch?.(bytes);
    if (read.error) return this.engineFailed(read.error, bytes);
    if (this.sse.tooLong) {
      this.stopLeg("line too long");
      return {
        done: true,
        end: {
          outcome: "failure",
          blame: "none",
          timeout: false,
          error: `decode node ${this.node} sent an event over ${MAX_DATA_LINE_BYTES} bytes, which must be rewritten to be relayed`,
        },
        bytes,
        error: encoder.encode(sseErrorEvent("an event too large to merge into a batched stream", "batch_event_too_large")),
      };
    }
    if (!ended) return { done: false, bytes };
    if (this.sse.complete) return { done: true, end: { outcome: "ok" }, bytes, error: EMPTY };
    const markers = this.o.completeness.kind === "done" ? "data: [DONE]" : this.o.completeness.types.join(" or ");
    return {
      done: true,
      end: { outcome: "failure", blame: "decode", timeout: false, error: `decode node ${this.node} ended its stream without ${markers}` },
      bytes,
      error: encoder.encode(sseErrorEvent("the decode node ended its stream before it was complete", "upstream_stream_incomplete")),
    };
  }

  /** The rest of D's answer is not wanted. */
  private stopLeg(why: string): void {
    this.o.leg.abort(why);
    this.o.reader.cancel().catch(() => undefined);
  }

  /**
   * D reported an error inside its stream after the answer began (an error as the first event
   * never gets here: the status line waits for it, and the request fails over; pipeline.ts). The
   * client's stream ends with the router's error event instead of D's, never [DONE]; whose fault
   * it was follows the status D gave it, as for a status line (upstream.ts `statusOutcome`), or
   * P's when P failed meanwhile (sglang, vllm-mooncake).
   */
  private engineFailed(err: EngineError, bytes: Uint8Array): SourceRead {
    // the rest of D's answer (its [DONE]) is not wanted
    this.stopLeg("error event");
    const said = `decode node ${this.node} reported an error inside its stream${err.status ? ` (HTTP ${err.status})` : ""}: ${redact(err.message, this.o.leg.call.node.access.token)}`;
    const failed = (end: StreamEnd & { outcome: "failure" }, event: string): SourceRead => ({ done: true, end, bytes, error: encoder.encode(event) });
    const partner = this.o.partnerFailure?.();
    if (partner) {
      return failed(
        { outcome: "failure", blame: "prefill", timeout: partner.kind === "timeout", error: `${partner.message}; ${said}`, prefill: partner.report() },
        sseErrorEvent("the prefill node failed while the answer streamed", "upstream_prefill_failed"),
      );
    }
    // no status: SGLang's native /generate, which writes one only for a ValueError (the request's validation)
    const status = err.status ?? 400;
    switch (statusOutcome(status, "engine")) {
      case "client_error":
        return failed(
          { outcome: "failure", blame: "client", timeout: false, error: said, status },
          sseErrorEvent(redact(err.message, this.o.leg.call.node.access.token), "upstream_rejected", "invalid_request_error"),
        );
      case "busy":
        return failed(
          { outcome: "failure", blame: "busy", timeout: false, error: said, status: 503 },
          sseErrorEvent("the decode node is busy and stopped this answer", "upstream_busy"),
        );
      case "failure":
        return failed(
          { outcome: "failure", blame: "decode", timeout: false, error: said },
          sseErrorEvent("the decode node reported an error while streaming", "upstream_stream_error"),
        );
    }
  }

  private readFailed(err: unknown): SourceRead {
    if (this.cancelled) return { done: true, end: this.cancelled, bytes: EMPTY, error: EMPTY };
    const failed = (end: StreamEnd & { outcome: "failure" }, message: string, code: string): SourceRead => ({
      done: true,
      end,
      bytes: EMPTY,
      error: encoder.encode(sseErrorEvent(message, code)),
    });
    // P failed after D's first byte and D's leg was aborted for it: not the client leaving
    const partner = this.o.partnerFailure?.();
    if (partner) {
      return failed(
        { outcome: "failure", blame: "prefill", timeout: partner.kind === "timeout", error: partner.message, prefill: partner.report() },
        "the prefill node failed while the answer streamed",
        "upstream_prefill_failed",
      );
    }
    if (this.o.leg.requestEnded && !this.idle) return { done: true, end: { outcome: "aborted", error: "client disconnected" }, bytes: EMPTY, error: EMPTY };
    if (this.idle) {
      return failed(
        { outcome: "failure", blame: "decode", timeout: true, error: `decode node ${this.node} sent nothing for ${this.o.idleMs} ms` },
        "the decode node stopped sending",
        "upstream_idle_timeout",
      );
    }
    return failed(
      { outcome: "failure", blame: "decode", timeout: false, error: `decode stream failed: ${(err as Error)?.message ?? String(err)}` },
      "the decode node failed while streaming",
      "upstream_stream_error",
    );
  }
}

/** Bytes of D's stream read at most before the status line goes out, when its first event is still undecided. */
export const FIRST_EVENT_MAX_BYTES = 64 * 1024;

/**
 * Reads D's stream until its first event is known not to be an error: the status line waits for
 * it (it is in D's first bytes: engines write an event whole), so an error D reports as its first
 * event — SGLang's decode whose KV transfer failed, vLLM's request that failed in the engine —
 * reached nobody and fails over like a refused request (Leg.errorEventFailure). Each read after
 * the first byte is bounded by `idleMs`; after FIRST_EVENT_MAX_BYTES of comments the answer goes
 * out anyway. Returns the bytes read, which the DecodeSource relays first.
 */
export async function readFirstEvent(leg: Leg, reader: ReadableStreamDefaultReader<Uint8Array>, idleMs: number): Promise<Uint8Array> {
  const sse = new SseReader({ kind: "done" });
  const parts: Uint8Array[] = [];
  let bytes = 0;
  for (;;) {
    let read: ReadableStreamReadResult<Uint8Array>;
    try {
      read = await reader.read();
    } catch (err) {
      throw leg.failure(err, "broken", bytes ? "broke off its stream in its first event" : "broke off its stream before the first byte");
    }
    if (read.done) {
      if (!bytes) throw leg.protocolFailure("ended its stream without a byte");
      const last = sse.end();
      if (last.error) throw leg.errorEventFailure(last.error);
      break;
    }
    if (!read.value.byteLength) continue;
    // the first byte is in: D's silences are bounded by decodeIdleMs from here
    leg.deadline(idleMs, `sent nothing for ${idleMs} ms inside its first event`);
    parts.push(read.value);
    bytes += read.value.byteLength;
    const g = sse.feed(read.value);
    if (g.error) throw leg.errorEventFailure(g.error);
    if (sse.firstSettled || bytes >= FIRST_EVENT_MAX_BYTES) break;
  }
  leg.clearDeadline();
  return parts.length === 1 ? parts[0]! : parts.reduce(concat);
}
