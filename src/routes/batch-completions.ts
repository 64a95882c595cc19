import { RouterError } from "../errors";
import { batchFeed, mergeCompletions, type CompletionObject } from "../forward/batch";
import { editMembers } from "../forward/json-text";
import type { RequestLife } from "../forward/lifecycle";
import type { Ctx } from "./app-env";
import { answerBody, answerHeaders, streamHasUsage, toClient } from "./answer";
import type { InferenceRequest } from "./request-schema";
import { route } from "./routed-request";

/** The prompts of a batched completions request (a list of several), or null for one prompt. */
export function batchPrompts(body: InferenceRequest): unknown[] | null {
  const prompt = (body as { prompt?: unknown }).prompt;
  if (!Array.isArray(prompt) || prompt.length < 2) return null;
  return typeof prompt[0] === "string" || Array.isArray(prompt[0]) ? prompt : null;
}

/**
 * A batched /v1/completions: vLLM's P returns one KV handle for a whole batch, so D would give
 * prompts 2..N the first prompt's KV. Each prompt becomes its own P/D request (own lease and
 * log line, id `<request id>/<i>`), and the answers merge into one: choice indexes as the
 * engine would number them (prompt i, sample j -> i*n + j), usage summed, streams interleaved
 * in order of arrival with one [DONE], pulled at the client's pace (batchFeed). One prompt that
 * fails before the response fails the batch at once: the others' requests end with its status.
 */
export async function forwardBatch(c: Ctx, path: string, raw: string, body: InferenceRequest, prompts: unknown[], requestId: string): Promise<Response> {
  const n = typeof body.n === "number" && body.n > 0 ? body.n : 1;
  const lives: RequestLife[] = [];
  let failed: RouterError | null = null;
  // their legs close now instead of running for a batch that failed (a vLLM handle is released)
  const abandon = (life: RequestLife, error: RouterError) => {
    if (!life.isEnded) life.end({ status: error.status, outcome: error.code === "client_closed_request" ? "aborted" : "error", error: "another prompt of the batch failed" });
  };
  const onLife = (life: RequestLife) => {
    lives.push(life);
    if (failed) abandon(life, failed);
  };
  // The first prompt that fails answers for the batch at once: the others' requests have ended
  // (abandon), and what they still finish — a vLLM P's answer in transit, read to its end to
  // release its handle (vllm.ts) — runs in the background, never before the client's answer.
  let failNow: () => void = () => undefined;
  const failedEarly = new Promise<null>((resolve) => {
    failNow = () => resolve(null);
  });
  const all = Promise.allSettled(
    prompts.map((prompt, i) => {
      const subRaw = editMembers(raw, { prompt: JSON.stringify(prompt) });
      return route(c, { kind: "completion", path, raw: subRaw, body: { ...body, prompt } as InferenceRequest, requestId: `${requestId}/${i}`, onLife }).catch((err: unknown) => {
        const error = err instanceof RouterError ? err : new RouterError(502, "The upstream request failed.", "upstream_error", "upstream_unavailable");
        failed ??= error;
        for (const life of lives) abandon(life, failed);
        failNow();
        throw err;
      });
    }),
  );
  const settled = await Promise.race([all, failedEarly]);
  if (failed || !settled) {
    for (const life of lives) abandon(life, failed!);
    throw failed!;
  }
  const routed = settled.flatMap((s) => (s.status === "fulfilled" ? [s.value] : []));
  const headers = answerHeaders(requestId, routed);
  const bodies = routed.map((r) => answerBody("completion", body, r));
  const jsons = bodies.flatMap((b) => ("json" in b ? [b.json] : []));
  if (jsons.length === bodies.length) {
    headers.set("content-type", "application/json");
    return new Response(
      mergeCompletions(
        jsons.map((j) => JSON.parse(j) as CompletionObject),
        n,
      ),
      { status: 200, headers },
    );
  }
  headers.set("content-type", "text/event-stream; charset=utf-8");
  headers.set("cache-control", "no-cache");
  const sources = bodies.flatMap((b) => ("source" in b ? [b.source] : []));
  const feed = batchFeed(sources, n, streamHasUsage("completion", body));
  return new Response(toClient(c, feed, routed[0]!.config.timeouts.decodeIdleMs, requestId), { status: 200, headers });
}
