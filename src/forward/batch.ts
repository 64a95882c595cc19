import { sseErrorEvent } from "../errors";
import type { ClientFeed } from "./client-stream";
import type { DecodeSource, SourceRead, StreamEnd } from "./decode-source";

// Merging the answers of a batched /v1/completions that was split into one P/D request per
// prompt: choice indexes as one engine would have numbered them (prompt i, sample j -> i*n + j,
// vLLM's serving_completion.py), usage summed, streams interleaved in order of arrival.

/**
 * Prompts one batched /v1/completions may carry; above it the request is refused (400 naming
 * `prompt`) before anything is sent. vLLM sets no limit; the router's comes from what a prompt
 * costs a Worker invocation and what a failing batch costs the GPUs:
 * - Subrequests (developers.cloudflare.com/workers/platform/limits/#subrequests): 10,000 an
 *   invocation on Workers Paid (1,000 in earlier revisions, and for calls to Cloudflare services
 *   such as Durable Objects), 50 on Free. One prompt costs 4-5 (the route call, P, D, the finish
 *   call, P's report when it cannot ride with the finish) plus a lease renewal every 20 s. When
 *   nodes fail it costs up to ~33: the route call twice (a new document), then per D attempt
 *   (at most 3) up to 9 — P tried on up to 3 nodes with 2 failover calls and its report, D, D's
 *   failover call and the release of P's unread handle — plus the finish call, and Mooncake's
 *   bootstrap query an attempt. 16 prompts x 33 = 528 stays within 1,000 with ten minutes of
 *   renewals to spare.
 * - Simultaneous connections: six waiting for response headers an invocation; a P leg waits
 *   for its headers for the whole prefill, so 16 prompts' prefills run in about three waves.
 * - A batch fails as a whole when one prompt fails: a larger batch throws away more GPU work
 *   (up to 15 finished prompts here) and is likelier to meet a failure.
 */
export const MAX_BATCH_PROMPTS = 16;

/** An event of a batched stream is parsed to renumber its choices; one larger than this cannot be, and fails the batch. */
export const MAX_BATCH_EVENT_CHARS = 1 << 20;

export interface CompletionObject {
  id?: string;
  choices?: Array<{ index?: number } & Record<string, unknown>>;
  usage?: Record<string, unknown> | null;
  [key: string]: unknown;
}

type Usage = { prompt_tokens: number; completion_tokens: number; total_tokens: number; cached_tokens: number };

const num = (v: unknown) => (typeof v === "number" ? v : 0);

function addUsage(sum: Usage, usage: Record<string, unknown> | null | undefined): void {
  if (!usage) return;
  sum.prompt_tokens += num(usage.prompt_tokens);
  sum.completion_tokens += num(usage.completion_tokens);
  sum.total_tokens += num(usage.total_tokens);
  sum.cached_tokens += num((usage.prompt_tokens_details as { cached_tokens?: unknown } | null | undefined)?.cached_tokens);
}

const usageObject = (u: Usage) => ({
  prompt_tokens: u.prompt_tokens,
  completion_tokens: u.completion_tokens,
  total_tokens: u.total_tokens,
  prompt_tokens_details: { cached_tokens: u.cached_tokens },
});

const emptyUsage = (): Usage => ({ prompt_tokens: 0, completion_tokens: 0, total_tokens: 0, cached_tokens: 0 });

function reindex(choices: CompletionObject["choices"], prompt: number, n: number): void {
  for (const choice of choices ?? []) choice.index = prompt * n + num(choice.index);
}

/** One completion object from the per-prompt answers (in prompt order). */
export function mergeCompletions(answers: CompletionObject[], n: number): string {
  const usage = emptyUsage();
  const choices: NonNullable<CompletionObject["choices"]> = [];
  answers.forEach((a, i) => {
    reindex(a.choices, i, n);
    choices.push(...(a.choices ?? []));
    addUsage(usage, a.usage);
  });
  choices.sort((a, b) => num(a.index) - num(b.index));
  return JSON.stringify({ ...answers[0], choices, usage: usageObject(usage) });
}

const encoder = new TextEncoder();

/**
 * The per-prompt decode streams merged into one client feed. Each source is read one chunk
 * ahead (a read stays pending on every open stream, never more than one chunk in hand a
 * prompt), and a chunk's whole events go out as soon as the client takes the previous ones,
 * their choices renumbered; usage-only events are held and summed into one before the single
 * [DONE]. So the client's pace is every prompt's pace: nothing is buffered for a client that
 * stops reading, and stopping the feed (the client gone or stalled) ends every prompt's request.
 * A prompt that fails ends the batch: its error event, never [DONE], and every other prompt's
 * legs closed (logged with the batch's failure, counted against no node).
 */
export function batchFeed(sources: DecodeSource[], n: number, withUsage: boolean): ClientFeed {
  const split = sources.map(() => ({ decoder: new TextDecoder(), partial: "" }));
  const ready: Array<{ prompt: number; read: SourceRead }> = [];
  let wake: (() => void) | null = null;
  const readAhead = (prompt: number) =>
    void sources[prompt]!.next().then((read) => {
      ready.push({ prompt, read });
      wake?.();
    });
  for (let i = 0; i < sources.length; i++) readAhead(i);
  const nextRead = async () => {
    while (!ready.length) await new Promise<void>((resolve) => (wake = resolve));
    wake = null;
    return ready.shift()!;
  };
  let open = sources.length;
  const usage = emptyUsage();
  let usageFrame: CompletionObject | null = null;
  const endOthers = (prompt: number, end: StreamEnd) => {
    for (const [k, s] of sources.entries()) if (k !== prompt) s.cancel(end);
  };
  const failBatch = (prompt: number, why: string): StreamEnd => ({ outcome: "failure", blame: "none", timeout: false, error: `${why} (prompt ${prompt})` });

  /** The whole events of a prompt's next bytes, renumbered; null when an event outgrows MAX_BATCH_EVENT_CHARS. */
  const events = (prompt: number, bytes: Uint8Array, last: boolean): string | null => {
    const s = split[prompt]!;
    const text = s.partial + s.decoder.decode(bytes, { stream: !last });
    const parts = text.split("\n\n");
    s.partial = last ? "" : (parts.pop() ?? "");
    if (s.partial.length > MAX_BATCH_EVENT_CHARS) return null;
    let out = "";
    for (const event of parts) {
      const data = event
        .split("\n")
        .find((l) => l.startsWith("data:"))
        ?.slice(5)
        .trim();
      if (!data || data === "[DONE]") continue;
      if (data.length > MAX_BATCH_EVENT_CHARS) return null;
      try {
        const json = JSON.parse(data) as CompletionObject;
        if (json.choices?.length === 0 && json.usage) {
          // the prompt's final usage frame: summed into the batch's one
          addUsage(usage, json.usage);
          usageFrame = json;
          continue;
        }
        reindex(json.choices, prompt, n);
        out += `data: ${JSON.stringify(json)}\n\n`;
      } catch {
        out += `${event}\n\n`;
      }
    }
    return out;
  };

  return {
    async next() {
      for (;;) {
        const { prompt, read } = await nextRead();
        const source = sources[prompt]!;
        if (!read.done) {
          const out = events(prompt, read.bytes, false);
          if (out === null) {
            const end = failBatch(prompt, `an event over ${MAX_BATCH_EVENT_CHARS} characters, which a batched stream cannot renumber`);
            source.cancel(end);
            endOthers(prompt, failBatch(prompt, "another prompt of the batch failed"));
            return { bytes: encoder.encode(sseErrorEvent("a prompt's stream sent an event too large to merge into a batched stream", "batch_event_too_large")), last: true };
          }
          readAhead(prompt);
          if (out) return { bytes: encoder.encode(out), last: false };
          continue;
        }
        if (read.end.outcome === "ok") {
          let out = events(prompt, read.bytes, true) ?? "";
          source.end(read.end);
          if (--open === 0) {
            if (withUsage && usageFrame) out += `data: ${JSON.stringify({ ...(usageFrame as CompletionObject), choices: [], usage: usageObject(usage) })}\n\n`;
            return { bytes: encoder.encode(`${out}data: [DONE]\n\n`), last: true };
          }
          if (out) return { bytes: encoder.encode(out), last: false };
          continue;
        }
        // a prompt failed, or its request ended: the batch ends with it (its error event, never [DONE])
        source.end(read.end);
        endOthers(prompt, read.end.outcome === "failure" ? failBatch(prompt, "another prompt of the batch failed") : read.end);
        return { bytes: read.error, last: true };
      }
    },
    stop(end) {
      for (const s of sources) s.cancel(end);
    },
    done() {
      // every prompt reported its end as it came
    },
    tick(now) {
      for (const s of sources) s.checkIdle(now);
    },
  };
}
