import { sseErrorEvent } from "../errors";

// Merging the answers of a batched /v1/completions that was split into one P/D request per
// prompt: choice indexes as one engine would have numbered them (prompt i, sample j -> i*n + j,
// vLLM's serving_completion.py), usage summed, streams interleaved in order of arrival.

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

/**
 * One SSE stream from the per-prompt streams: each event goes out as soon as it arrives with its
 * choices renumbered; usage-only events are held and summed into one before the single [DONE].
 * A failed sub-stream ends the merged stream with an error event; the client leaving cancels all.
 */
export function mergeStreams(streams: ReadableStream<Uint8Array>[], n: number, withUsage: boolean): ReadableStream<Uint8Array> {
  const encoder = new TextEncoder();
  const usage = emptyUsage();
  let last: CompletionObject | null = null;
  const readers = streams.map((s) => s.getReader());
  let failed = false;
  return new ReadableStream<Uint8Array>({
    async start(controller) {
      const pump = async (reader: ReadableStreamDefaultReader<Uint8Array>, prompt: number) => {
        const decoder = new TextDecoder();
        let partial = "";
        for (;;) {
          const { done, value } = await reader.read();
          if (failed) return void reader.cancel().catch(() => undefined);
          const text = partial + (done ? decoder.decode() : decoder.decode(value, { stream: true }));
          const events = text.split("\n\n");
          partial = done ? "" : (events.pop() ?? "");
          let out = "";
          for (const event of events) {
            if (event.startsWith("event: error")) {
              // a prompt's stream failed: the batch ends with its error event, never [DONE]
              failed = true;
              controller.enqueue(encoder.encode(`${out}${event}\n\n`));
              return;
            }
            const data = event
              .split("\n")
              .find((l) => l.startsWith("data:"))
              ?.slice(5)
              .trim();
            if (!data || data === "[DONE]") continue;
            try {
              const json = JSON.parse(data) as CompletionObject;
              if (json.choices?.length === 0 && json.usage) {
                // the prompt's final usage frame: summed into the batch's one
                addUsage(usage, json.usage);
                last = json;
                continue;
              }
              reindex(json.choices, prompt, n);
              out += `data: ${JSON.stringify(json)}\n\n`;
            } catch {
              out += `${event}\n\n`;
            }
          }
          if (out) controller.enqueue(encoder.encode(out));
          if (done || failed) return;
        }
      };
      try {
        await Promise.all(readers.map((r, i) => pump(r, i)));
      } catch {
        failed = true;
        controller.enqueue(encoder.encode(sseErrorEvent("a prompt of the batch failed while streaming")));
      }
      if (failed) {
        for (const r of readers) r.cancel().catch(() => undefined);
        controller.close();
        return;
      }
      if (withUsage && last) controller.enqueue(encoder.encode(`data: ${JSON.stringify({ ...(last as CompletionObject), choices: [], usage: usageObject(usage) })}\n\n`));
      controller.enqueue(encoder.encode("data: [DONE]\n\n"));
      controller.close();
    },
    cancel(reason) {
      for (const r of readers) r.cancel(reason).catch(() => undefined);
    },
  });
}
