import type { DecodeSource, StreamEnd } from "./decode-source";
import { joinBytes } from "./sse-reader";

/** What a client stream writes: one decode source (a single request) or several merged (a batch). */
export interface ClientFeed {
  /** the next bytes for the client; `last`: the stream ends after them */
  next(): Promise<{ bytes: Uint8Array; last: boolean }>;
  /** the client left or stopped reading (or the relay broke): whatever still runs ends with `end` */
  stop(end: StreamEnd): void;
  /** the last bytes reached the client and its stream closed */
  done(): void;
  /** the watchdog's tick (a decode node silent too long) */
  tick(now: number): void;
}

export interface ClientStreamOptions {
  /** longest time the client may leave a chunk unread (gone without a signal, or not reading) */
  stallMs: number;
  /** the decode idle timeout: the watchdog ticks often enough for it */
  idleMs: number;
  /**
   * Keeps the relay running past the client (the request's waitUntil). workerd cancels a
   * request's pending I/O and timers once it finds its client gone, unless waitUntil holds
   * them: without this the relay would never reach its end (no log line, no release but expiry).
   */
  waitUntil?(promise: Promise<unknown>): void;
}

const stalledEnd = (stallMs: number): StreamEnd => ({ outcome: "stalled", error: `the client read nothing for ${stallMs} ms` });

/**
 * The client's body: a native stream the feed's bytes are written into, one write at a time —
 * the feed is asked for more only once the client took the last bytes, so backpressure holds
 * from the client's socket back to every decode node. A native stream because workerd tells
 * a client that leaves mid-stream through it (the pending write fails at once); through a JS
 * stream it never did (the request's timers keep its I/O alive, so the legs ran on until the
 * stall bound). Measured with 1,000 streams (bench/results/overhead.md): upstream legs closed
 * ~0.7 s after the clients left, against 11 s through a JS stream. A watchdog ends the stream
 * when a write has waited `stallMs`: the client left unseen (no request.signal came: locally, a
 * client's half-close before anything was written, docs/testing.md) or stopped reading.
 */
export function clientStream(feed: ClientFeed, o: ClientStreamOptions): ReadableStream<Uint8Array> {
  const { readable, writable } = new IdentityTransformStream();
  const writer = writable.getWriter();
  // Ends the client's side from here (a native stream aborts even behind a pending write).
  const endClientSide = (why: string) => void writer.abort(new Error(why)).catch(() => undefined);
  /** a write to the client is pending (since when) */
  let writingSince = 0;
  let stalled = false;
  const period = Math.max(25, Math.min(1000, Math.min(o.idleMs, o.stallMs) / 4));
  const watchdog = setInterval(() => {
    const now = Date.now();
    if (writingSince && now - writingSince > o.stallMs) {
      stalled = true;
      feed.stop(stalledEnd(o.stallMs));
      endClientSide("client stopped reading");
    } else feed.tick(now);
  }, period);

  const pump = async (): Promise<void> => {
    for (;;) {
      const out = await feed.next();
      try {
        if (out.bytes.byteLength) {
          writingSince = Date.now();
          await writer.write(out.bytes);
          writingSince = 0;
        }
        if (out.last) {
          await writer.close();
          feed.done();
          return;
        }
      } catch {
        feed.stop(stalled ? stalledEnd(o.stallMs) : { outcome: "aborted", error: "client disconnected" });
        endClientSide("client went away");
        return;
      }
    }
  };
  const running = pump()
    .catch((err: unknown) => {
      feed.stop({ outcome: "failure", blame: "none", timeout: false, error: `the relay failed: ${String(err)}` });
      endClientSide("relay failed");
    })
    .finally(() => clearInterval(watchdog));
  o.waitUntil?.(running);
  return readable;
}

/** One request's decode stream as the client's feed: D's bytes as they come, then its error event if it failed. */
export function singleFeed(source: DecodeSource): ClientFeed {
  /** how D's stream ended, once it did */
  let ending: StreamEnd | null = null;
  return {
    async next() {
      const read = await source.next();
      if (!read.done) return { bytes: read.bytes, last: false };
      ending = read.end;
      return { bytes: joinBytes([read.bytes, read.error]), last: true };
    },
    stop(end) {
      // a node that failed stays blamed even if the client could not be told
      if (ending?.outcome === "failure") source.end(ending);
      else source.cancel(end);
    },
    done() {
      source.end(ending ?? { outcome: "ok" });
    },
    tick(now) {
      source.checkIdle(now);
    },
  };
}
