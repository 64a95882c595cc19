import type { ClientFeed } from "./client-stream";
import type { DecodeSource, SourceRead, StreamEnd } from "./decode-source";
import { joinBytes } from "./sse-reader";

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

export interface CompletionObject {
  id?: string;
  choices?: Array<{ index?: number } & Record<string, unknown>>;
  usage?: Record<string, unknown> | null;
  [key: string]: unknown;
}

const num = (v: unknown) => (typeof v === "number" ? v : 0);

const emptyUsage = () => ({ prompt_tokens: 0, completion_tokens: 0, total_tokens: 0, prompt_tokens_details: { cached_tokens: 0 } });

/** Adds a prompt's usage to the batch's. */
function addUsage(sum: ReturnType<typeof emptyUsage>, usage: Record<string, unknown> | null | undefined): void {
  if (!usage) return;
  for (const k of ["prompt_tokens", "completion_tokens", "total_tokens"] as const) sum[k] += num(usage[k]);
  sum.prompt_tokens_details.cached_tokens += num((usage.prompt_tokens_details as { cached_tokens?: unknown } | null | undefined)?.cached_tokens);
}

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
  return JSON.stringify({ ...answers[0], choices, usage });
}

const encoder = new TextEncoder();

/**
 * The per-prompt decode streams merged into one client feed. Each source is read one chunk
 * ahead (a read stays pending on every open stream, never more than one chunk in hand a
 * prompt), and a chunk's events go out as soon as the client takes the previous ones, their
 * choices renumbered as each source's reader passes them (a data line too long to renumber,
 * over MAX_DATA_LINE_BYTES, fails the batch); usage-only events are held and summed into one
 * before the single [DONE]. So the client's pace is every prompt's pace: nothing is buffered
 * for a client that stops reading, and stopping the feed (the client gone or stalled) ends
 * every prompt's request. A prompt that fails ends the batch: its error event, never [DONE],
 * and every other prompt's legs closed (logged with the batch's failure, counted against no
 * node).
 */
export function batchFeed(sources: DecodeSource[], n: number, withUsage: boolean): ClientFeed {
  const usage = emptyUsage();
  let usageFrame: CompletionObject | null = null;
  for (const [prompt, source] of sources.entries()) {
    source.rewriteAlso({
      required: true,
      line(value) {
        if (value.trim() === "[DONE]") return null;
        let json: CompletionObject;
        try {
          json = JSON.parse(value) as CompletionObject;
        } catch {
          return value;
        }
        if (json?.choices?.length === 0 && json.usage) {
          // the prompt's final usage frame: summed into the batch's one
          addUsage(usage, json.usage);
          usageFrame = json;
          return null;
        }
        reindex(json?.choices, prompt, n);
        return JSON.stringify(json);
      },
    });
  }
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
  const endOthers = (prompt: number, end: StreamEnd) => {
    for (const [k, s] of sources.entries()) if (k !== prompt) s.cancel(end);
  };

  return {
    async next() {
      for (;;) {
        const { prompt, read } = await nextRead();
        const source = sources[prompt]!;
        if (!read.done) {
          readAhead(prompt);
          if (read.bytes.byteLength) return { bytes: read.bytes, last: false };
          continue;
        }
        source.end(read.end);
        if (read.end.outcome === "ok") {
          if (--open === 0) {
            const frame = withUsage && usageFrame ? `data: ${JSON.stringify({ ...(usageFrame as CompletionObject), choices: [], usage })}\n\n` : "";
            return { bytes: joinBytes([read.bytes, encoder.encode(`${frame}data: [DONE]\n\n`)]), last: true };
          }
          if (read.bytes.byteLength) return { bytes: read.bytes, last: false };
          continue;
        }
        // a prompt failed, or its request ended: the batch ends with it (its error event, never [DONE])
        endOthers(
          prompt,
          read.end.outcome === "failure" ? { outcome: "failure", blame: "none", timeout: false, error: `another prompt of the batch failed (prompt ${prompt})` } : read.end,
        );
        return { bytes: joinBytes([read.bytes, read.error]), last: true };
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
