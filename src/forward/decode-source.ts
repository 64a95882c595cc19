import { sseErrorEvent } from "../errors";
import type { LegReport } from "../state/types";
import { CompletenessJudge, type Completeness } from "./sse-scan";
import type { ChunkRewriter } from "./stream";
import type { Leg, UpstreamFailure } from "./upstream";

/**
 * How a relayed stream ended. `failure` names whose failure it was: D's own (counted against D),
 * P's when P failed after D's first byte (counted against P; D's leg was only aborted), or
 * nobody's (another prompt of a batch failed).
 */
export type StreamEnd =
  | { outcome: "ok" }
  | { outcome: "failure"; error: string; timeout: boolean; blame: "decode" | "prefill" | "none"; prefill?: LegReport }
  | { outcome: "aborted"; error: string }
  | { outcome: "stalled"; error: string };

/** One read of a source: D's next bytes (rewritten where they must be), or how the stream ended. */
export type SourceRead =
  | { done: false; bytes: Uint8Array }
  /** `bytes`: what D sent last (a rewriter's held line); `error`: the SSE error event to end the client's stream with, or none */
  | { done: true; end: StreamEnd; bytes: Uint8Array; error: Uint8Array };

export interface DecodeSourceOptions {
  leg: Leg;
  reader: ReadableStreamDefaultReader<Uint8Array>;
  /** D's first body bytes, already read (the status line waited for them) */
  first: Uint8Array;
  rewriter: ChunkRewriter | null;
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
  private readonly judge: CompletenessJudge;
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
    this.judge = new CompletenessJudge(o.completeness);
  }

  get node(): string {
    return this.o.leg.node;
  }

  async next(): Promise<SourceRead> {
    if (this.first) {
      const first = this.first;
      this.first = null;
      return { done: false, bytes: this.pass(first) };
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
    if (!chunk.done) return { done: false, bytes: this.pass(chunk.value) };
    const held = this.o.rewriter ? this.o.rewriter.flush() : EMPTY;
    if (this.judge.end()) return { done: true, end: { outcome: "ok" }, bytes: held, error: EMPTY };
    const markers = this.o.completeness.kind === "done" ? "data: [DONE]" : this.o.completeness.types.join(" or ");
    return {
      done: true,
      end: { outcome: "failure", blame: "decode", timeout: false, error: `decode node ${this.node} ended its stream without ${markers}` },
      bytes: held,
      error: encoder.encode(sseErrorEvent("the decode node ended its stream before it was complete", "upstream_stream_incomplete")),
    };
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

  private pass(bytes: Uint8Array): Uint8Array {
    this.judge.feed(bytes);
    return this.o.rewriter ? this.o.rewriter.chunk(bytes) : bytes;
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
