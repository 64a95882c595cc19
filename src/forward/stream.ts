import { sseErrorEvent } from "../errors";
import { editMembers } from "./json-text";
import type { Leg } from "./upstream";

export type StreamEnd = { outcome: "ok" } | { outcome: "failure"; error: string; timeout: boolean } | { outcome: "aborted"; error: string } | { outcome: "stalled"; error: string };

/** Rewrites a stream's bytes chunk by chunk; `flush` returns what it still holds at the end. */
export interface ChunkRewriter {
  chunk(bytes: Uint8Array): Uint8Array;
  flush(): Uint8Array;
}

export interface RelayOptions {
  leg: Leg;
  reader: ReadableStreamDefaultReader<Uint8Array>;
  /** D's first body bytes, already read (the status line waited for them) */
  first: Uint8Array;
  rewriter: ChunkRewriter | null;
  /** longest silence from D between body bytes */
  idleMs: number;
  /** longest time the client may leave a chunk unread (gone without a signal, or not reading) */
  stallMs: number;
  /** called once, however the stream ends */
  onEnd(end: StreamEnd): void;
  /**
   * What a complete stream ends with (`data: [DONE]`; a Responses stream's final event): a
   * stream that ends cleanly without one was cut, and ends with an error event instead.
   */
  endMarkers?: string[];
  /**
   * Keeps the relay running past the client (the request's waitUntil). workerd cancels a
   * request's pending I/O and timers once it finds its client gone, unless waitUntil holds
   * them: without this the relay would never reach onEnd (no log line, no release but expiry).
   */
  waitUntil?(promise: Promise<unknown>): void;
}

const encoder = new TextEncoder();

/**
 * Relays D's SSE body to the client and watches both ends. The client's stream pulls: each
 * time the runtime wants more for the client, one chunk is read from D (rewritten only when a
 * usage frame must be) — no loop of our own, no writer, nothing buffered beyond the chunk in
 * hand. A watchdog ends the stream when D falls silent for `idleMs` while the client waits (an
 * error event, counted against D), or when the client has not asked for more for `stallMs`: it
 * left before the response began (workerd then gives no signal and nobody reads) or stopped
 * reading — the legs are closed and the lease released instead of holding them for nobody.
 */
export function relayStream(o: RelayOptions): ReadableStream<Uint8Array> {
  const rewriter = o.rewriter;
  // A native stream to the client. workerd notices a client that leaves mid-stream through it
  // and fails the pending write at once; through a JS stream it never told (the request's timers
  // keep its I/O alive, so the legs ran on until CLIENT_STALL_MS). Measured with 1,000 streams
  // (bench/results/overhead.md): upstream legs closed ~0.7 s after the clients left, against
  // 11 s through a JS TransformStream, for ~75 KB more memory a stream.
  const { readable, writable } = new IdentityTransformStream();
  const writer = writable.getWriter();
  // Ends the client's side from here (a native stream aborts even behind a pending write).
  const endClientSide = (why: string) => void writer.abort(new Error(why)).catch(() => undefined);
  /** when D last gave a chunk (or the relay began) */
  let lastChunkAt = Date.now();
  /** a read from D is pending, or a write to the client (since when) */
  let reading = false;
  let writingSince = 0;
  let idle = false;
  let stalled = false;
  /** the last two chunks: how the stream ended is read from them once it ended (endMarkers) */
  let last: Uint8Array = o.first;
  let beforeLast: Uint8Array = new Uint8Array(0);
  const tail = () => new TextDecoder().decode(concat([beforeLast.subarray(-TAIL_BYTES), last.subarray(-TAIL_BYTES)]));
  const period = Math.max(25, Math.min(1000, Math.min(o.idleMs, o.stallMs) / 4));
  const watchdog = setInterval(() => {
    const now = Date.now();
    if (writingSince && now - writingSince > o.stallMs) {
      // the client has not taken the last chunk: it left before the response began, or stopped reading
      stalled = true;
      o.leg.abort("client stopped reading");
      endClientSide("client stopped reading");
    } else if (reading && now - lastChunkAt > o.idleMs) {
      // the client waits and D says nothing: the pending read fails as idle
      idle = true;
      o.leg.abort("decode idle timeout");
    }
  }, period);
  const write = async (bytes: Uint8Array) => {
    if (bytes.byteLength === 0) return;
    writingSince = Date.now();
    await writer.write(bytes);
    writingSince = 0;
  };
  const clientGone = (): StreamEnd => {
    o.leg.abort("client went away");
    o.reader.cancel().catch(() => undefined);
    endClientSide("client went away");
    return stalled ? { outcome: "stalled", error: `the client read nothing for ${o.stallMs} ms` } : { outcome: "aborted", error: "client disconnected" };
  };
  /** ends the client's stream with an error event (never a silent truncated 200) */
  const failWith = async (message: string, code: string): Promise<boolean> => {
    try {
      await write(encoder.encode(sseErrorEvent(message, code)));
      await writer.close();
      return true;
    } catch {
      return false;
    }
  };

  const pump = async (): Promise<StreamEnd> => {
    try {
      await write(rewriter ? rewriter.chunk(o.first) : o.first);
    } catch {
      return clientGone();
    }
    for (;;) {
      let chunk: ReadableStreamReadResult<Uint8Array>;
      reading = true;
      try {
        chunk = await o.reader.read();
      } catch (err) {
        reading = false;
        if (stalled || (o.leg.requestEnded && !idle)) return clientGone();
        const error = idle ? `decode node ${o.leg.node} sent nothing for ${o.idleMs} ms` : `decode stream failed: ${(err as Error)?.message ?? String(err)}`;
        const told = await failWith(idle ? "the decode node stopped sending" : "the decode node failed while streaming", idle ? "upstream_idle_timeout" : "upstream_stream_error");
        return told ? { outcome: "failure", error, timeout: idle } : clientGone();
      }
      reading = false;
      lastChunkAt = Date.now();
      try {
        if (chunk.done) {
          if (rewriter) await write(rewriter.flush());
          if (o.endMarkers && !o.endMarkers.some((m) => tail().includes(m))) {
            const error = `decode node ${o.leg.node} ended its stream without ${o.endMarkers.join(" or ")}`;
            return (await failWith("the decode node ended its stream before it was complete", "upstream_stream_incomplete"))
              ? { outcome: "failure", error, timeout: false }
              : clientGone();
          }
          await writer.close();
          return { outcome: "ok" };
        }
        if (chunk.value.byteLength) {
          beforeLast = last;
          last = chunk.value;
        }
        await write(rewriter ? rewriter.chunk(chunk.value) : chunk.value);
      } catch {
        return clientGone();
      }
    }
  };
  const done = pump()
    .catch((err): StreamEnd => ({ outcome: "failure", error: String(err), timeout: false }))
    .then((end) => {
      clearInterval(watchdog);
      o.leg.close();
      o.onEnd(end);
    });
  // workerd drops a request's timers and I/O once its client is gone unless waitUntil holds them
  o.waitUntil?.(done);
  return readable;
}

/** How much of a stream's end is kept to check how it ended. */
const TAIL_BYTES = 256;

/** Lines longer than this are passed on without being held for rewriting (a D that never sends a newline). */
export const MAX_REWRITE_LINE_BYTES = 1 << 20;

const NEWLINE = 0x0a;

function concat(parts: Uint8Array[]): Uint8Array {
  if (parts.length === 1) return parts[0]!;
  const out = new Uint8Array(parts.reduce((n, p) => n + p.byteLength, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.byteLength;
  }
  return out;
}

/**
 * Rewrites the SSE `data:` lines that carry a usage object, passing every other byte through.
 * Linear in the bytes: each byte is looked at once when its line completes; a partial line is
 * held (as chunks, never re-concatenated) up to MAX_REWRITE_LINE_BYTES, past which it flows on
 * unchanged. Chunks without a `"usage"` are forwarded as the same bytes.
 */
export function sseUsageRewriter(fix: (usage: Record<string, unknown>) => void): ChunkRewriter {
  const decoder = new TextDecoder();
  let held: Uint8Array[] = [];
  let heldBytes = 0;
  /** the current line outgrew the limit: pass it through up to its newline */
  let passing = false;
  const rewriteText = (bytes: Uint8Array): Uint8Array => {
    const text = decoder.decode(bytes);
    if (!text.includes('"usage"')) return bytes;
    return encoder.encode(
      text
        .split("\n")
        .map((line) => rewriteUsageLine(line, fix))
        .join("\n"),
    );
  };
  return {
    chunk(bytes) {
      const nl = bytes.lastIndexOf(NEWLINE);
      if (nl < 0) {
        if (passing) return bytes;
        held.push(bytes);
        heldBytes += bytes.byteLength;
        if (heldBytes <= MAX_REWRITE_LINE_BYTES) return new Uint8Array(0);
        passing = true;
        const out = concat(held);
        held = [];
        heldBytes = 0;
        return out;
      }
      const head = bytes.subarray(0, nl + 1);
      const rest = bytes.subarray(nl + 1);
      let out: Uint8Array;
      if (passing) {
        // the over-long line ends at the first newline; the lines after it are rewritten as usual
        const first = head.indexOf(NEWLINE);
        out = concat([head.subarray(0, first + 1), rewriteText(head.subarray(first + 1))]);
        passing = false;
      } else {
        out = rewriteText(held.length ? concat([...held, head]) : head);
      }
      held = rest.byteLength ? [rest] : [];
      heldBytes = rest.byteLength;
      return out;
    },
    flush() {
      const out = held.length ? (passing ? concat(held) : rewriteText(concat(held))) : new Uint8Array(0);
      held = [];
      heldBytes = 0;
      return out;
    },
  };
}

/** Rewrites one SSE `data:` line whose JSON carries a usage object; the rest of the line is kept byte for byte. */
export function rewriteUsageLine(line: string, fix: (usage: Record<string, unknown>) => void): string {
  if (!line.startsWith("data:") || !line.includes('"usage"')) return line;
  const json = line.slice(5).trim();
  const fixed = fixUsageInBody(json, fix);
  return fixed === json ? line : `data: ${fixed}`;
}

/**
 * The member of a completion object (or Responses API event) that holds the usage: `usage`
 * itself, or `response` whose `usage` it is (a Responses object inside `response.completed`).
 */
function usageHolder(json: string): { member: "usage" | "response"; value: Record<string, unknown>; usage: Record<string, unknown> } | null {
  try {
    const event = JSON.parse(json) as { usage?: unknown; response?: { usage?: unknown } };
    if (event.usage && typeof event.usage === "object") return { member: "usage", value: event.usage as Record<string, unknown>, usage: event.usage as Record<string, unknown> };
    const response = event.response;
    if (response && typeof response === "object" && response.usage && typeof response.usage === "object") {
      return { member: "response", value: response as Record<string, unknown>, usage: response.usage as Record<string, unknown> };
    }
  } catch {
    // not JSON: nothing to fix
  }
  return null;
}

/** P's token counts: what P prefilled and how much of it P had cached. */
export interface PrefillUsage {
  promptTokens: number | null;
  cachedTokens: number;
}

type UsageShape = {
  prompt_tokens?: unknown;
  prompt_tokens_details?: { cached_tokens?: unknown } | null;
  input_tokens?: unknown;
  input_tokens_details?: { cached_tokens?: unknown } | null;
};

/** P's usage as P reported it (vLLM omits prompt_tokens_details when nothing was cached: that is 0). Chat, completions or Responses shape. */
export function prefillUsageOf(json: Record<string, unknown>): PrefillUsage {
  const usage = json.usage as UsageShape | undefined;
  const cached = usage?.prompt_tokens_details?.cached_tokens ?? usage?.input_tokens_details?.cached_tokens;
  const prompt = usage?.prompt_tokens ?? usage?.input_tokens;
  return { promptTokens: typeof prompt === "number" ? prompt : null, cachedTokens: typeof cached === "number" ? cached : 0 };
}

/**
 * D's usage as the client should see it: D counts the KV it pulled from P as cached, so the
 * prompt counts and cached tokens come from P, and the total is recomputed
 * (vllm-project/router merges usage the same way).
 */
export function fixUsage(p: PrefillUsage): (usage: Record<string, unknown>) => void {
  return (usage) => {
    // Responses API usage names the same counts input/output tokens
    const [prompt, details, completion] =
      "input_tokens" in usage ? ["input_tokens", "input_tokens_details", "output_tokens"] : ["prompt_tokens", "prompt_tokens_details", "completion_tokens"];
    if (p.promptTokens !== null) usage[prompt] = p.promptTokens;
    const held = usage[details] && typeof usage[details] === "object" ? (usage[details] as Record<string, unknown>) : {};
    usage[details] = { ...held, cached_tokens: p.cachedTokens };
    const promptTokens = typeof usage[prompt] === "number" ? (usage[prompt] as number) : 0;
    const completionTokens = typeof usage[completion] === "number" ? (usage[completion] as number) : 0;
    usage.total_tokens = promptTokens + completionTokens;
  };
}

/** A completion object's (or Responses event's) text with its usage fixed; every other member byte for byte. */
export function fixUsageInBody(text: string, fix: (usage: Record<string, unknown>) => void): string {
  const holder = usageHolder(text);
  if (!holder) return text;
  fix(holder.usage);
  return editMembers(text, { [holder.member]: JSON.stringify(holder.value) });
}
