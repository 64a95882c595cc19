import { sseErrorEvent } from "../errors";

export type StreamEnd = { outcome: "ok" } | { outcome: "failure"; error: string } | { outcome: "aborted" };

export interface ObserveOptions {
  /** the body is an SSE stream: a failure mid-way ends it with an error event */
  sse: boolean;
  /** rewrites one complete line (SSE `data:` line); only when set is the text decoded at all */
  rewriteLine?: ((line: string) => string) | undefined;
  /** called once, when the body ended, failed, or the client went away */
  onEnd(end: StreamEnd): void;
  /** aborts the upstream fetch when the client cancels */
  abortUpstream(reason: string): void;
}

/**
 * Passes D's body through chunk by chunk and watches how it ends: completed, failed, or the
 * client gone. The pump awaits each write, so nothing is buffered beyond the chunk in hand (or a
 * partial line while rewriting). Returns the client's body and the pump, for waitUntil.
 */
export function observeStream(body: ReadableStream<Uint8Array>, opts: ObserveOptions): { body: ReadableStream<Uint8Array>; done: Promise<void> } {
  const { readable, writable } = new TransformStream<Uint8Array, Uint8Array>();
  const writer = writable.getWriter();
  const reader = body.getReader();
  const encoder = new TextEncoder();
  const decoder = opts.rewriteLine ? new TextDecoder() : null;
  let partial = "";
  const rewrite = (text: string, final: boolean): string => {
    const lines = (partial + text).split("\n");
    partial = final ? "" : (lines.pop() ?? "");
    return lines.map(opts.rewriteLine!).join("\n") + (lines.length && !final ? "\n" : "");
  };
  const clientGone = (err: unknown) => {
    opts.abortUpstream(`client went away: ${String(err)}`);
    reader.cancel(err).catch(() => undefined);
  };

  const pump = async (): Promise<StreamEnd> => {
    for (;;) {
      let chunk: ReadableStreamReadResult<Uint8Array>;
      try {
        chunk = await reader.read();
      } catch (err) {
        const error = `decode stream failed: ${(err as Error)?.message ?? String(err)}`;
        // Never a silent truncated 200: SSE clients get an error event; others see the body cut short.
        try {
          if (opts.sse) {
            await writer.write(encoder.encode(sseErrorEvent("the decode node failed while streaming")));
            await writer.close();
          } else {
            await writer.abort(new Error(error));
          }
        } catch {
          // the client is gone as well
        }
        return { outcome: "failure", error };
      }
      try {
        if (chunk.done) {
          if (decoder && partial) await writer.write(encoder.encode(rewrite(decoder.decode(), true)));
          await writer.close();
          return { outcome: "ok" };
        }
        if (!decoder) await writer.write(chunk.value);
        else {
          const out = rewrite(decoder.decode(chunk.value, { stream: true }), false);
          if (out) await writer.write(encoder.encode(out));
        }
      } catch (err) {
        clientGone(err);
        return { outcome: "aborted" };
      }
    }
  };
  const done = pump().then((end) => opts.onEnd(end));
  return { body: readable, done };
}

/** Sets usage.prompt_tokens_details.cached_tokens in an SSE `data:` line that carries usage. */
export function rewriteUsageLine(cachedTokens: number): (line: string) => string {
  return (line) => {
    if (!line.startsWith("data:") || !line.includes('"usage"')) return line;
    try {
      const event = JSON.parse(line.slice(5)) as Record<string, unknown>;
      if (!setCachedTokens(event, cachedTokens)) return line;
      return `data: ${JSON.stringify(event)}`;
    } catch {
      return line;
    }
  };
}

/** Writes P's cached_tokens into a completion object's usage; false when it has none. */
export function setCachedTokens(json: Record<string, unknown>, cachedTokens: number): boolean {
  const usage = json.usage;
  if (!usage || typeof usage !== "object") return false;
  const u = usage as Record<string, unknown>;
  const details = (u.prompt_tokens_details && typeof u.prompt_tokens_details === "object" ? u.prompt_tokens_details : {}) as Record<string, unknown>;
  u.prompt_tokens_details = { ...details, cached_tokens: cachedTokens };
  return true;
}
