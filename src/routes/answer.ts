import { numberVar } from "../config/runtime";
import { clientStream, singleFeed } from "../forward/client-stream";
import { decodeSource, type DecodeSource, type StreamEnd } from "../forward/decode-source";
import type { RequestLife } from "../forward/lifecycle";
import type { DecodeAnswer } from "../forward/pipeline";
import { rememberResponse, responseIdWatcher } from "../forward/response-id";
import type { Completeness } from "../forward/sse-reader";
import { fixUsage, fixUsageInBody, usageRewrite } from "../forward/stream";
import { streamPace } from "../forward/stream-pace";
import { jsonAnswerUsage, outputTokensObserver, usageObserver, type AnswerUsage } from "../forward/usage-watch";
import { background } from "../observability/log";
import type { LegReport } from "../state/types";
import type { Ctx } from "./app-env";
import type { InferenceRequest, RequestKind } from "./request-schema";
import type { Routed } from "./routed-request";

// The last step of a routed request: D's answer becomes the client's response, and the request's
// life ends when its body does (at once for JSON, at the stream's end otherwise).

/** How long a write to the client may wait before the client counts as gone (it left before the response, or stopped reading). */
export const DEFAULT_CLIENT_STALL_MS = 10_000;

const positive = (n: number) => n > 0;

/** The events that end a complete Responses API stream (vLLM's responses/serving.py). */
const RESPONSES_COMPLETE: Completeness = { kind: "events", types: ["response.completed", "response.incomplete", "response.failed"] };
const DONE_COMPLETE: Completeness = { kind: "done" };

/** One routed request's response: D's JSON, or D's stream relayed at the client's pace. */
export function singleResponse(c: Ctx, kind: RequestKind, body: InferenceRequest, requestId: string, routed: Routed): Response {
  const headers = answerHeaders(requestId, [routed]);
  const out = answerBody(kind, body, routed);
  if ("json" in out) {
    headers.set("content-type", "application/json");
    return new Response(out.json, { status: 200, headers });
  }
  headers.set("content-type", "text/event-stream; charset=utf-8");
  headers.set("cache-control", "no-cache");
  return new Response(toClient(c, singleFeed(out.source), routed.config.timeouts.decodeIdleMs, requestId), { status: 200, headers });
}

/** The client asked for a usage frame (a Responses stream always has one); an engine may send one unasked (--enable-force-include-usage), which answerBody fixes too. */
export function streamHasUsage(kind: RequestKind, parsed: Record<string, unknown>): boolean {
  if (kind === "responses") return true;
  const o = parsed.stream_options as { include_usage?: unknown; continuous_usage_stats?: unknown } | null | undefined;
  return Boolean(o && (o.include_usage || o.continuous_usage_stats));
}

/** D's answer as the client's body: a whole JSON text, or D's stream as a source to relay. Ends the life when the body ends. */
export function answerBody(kind: RequestKind, body: InferenceRequest, { life, config, answer }: Routed): { json: string } | { source: DecodeSource } {
  const fix = answer.prefillUsage ? fixUsage(answer.prefillUsage) : null;
  // a node that prefilled alone (colocated, a local prefill, a pinned turn) reports its own usage
  // (one-hop answers and prompts of unknown size teach nothing: no prediction, no rate to learn)
  const alone = answer.prefillNode === answer.decodeNode && life.mode !== null && life.mode !== "disaggregated" && (life.decision?.tokens.prompt ?? 0) > 0;
  let seen: AnswerUsage | null = null;
  if (alone) life.reportEngineUsage(() => (seen ? { node: answer.decodeNode, ...seen } : null));
  life.responding();
  if (answer.body.kind === "json") {
    if (alone) seen = jsonAnswerUsage(answer.body.text);
    const text = fix ? fixUsageInBody(answer.body.text, fix) : answer.body.text;
    if (kind === "responses") rememberResponse(life, text);
    life.end({ status: 200, outcome: "ok", legs: { decode: decodeLeg(answer, "ok") } });
    return { json: text };
  }
  // every usage frame the stream carries — the client asked for it, or the engine runs with
  // --enable-force-include-usage (vLLM, SGLang) and sends one anyway — is fixed with P's counts
  // (else the client sees D's, which counts the KV it pulled as cached), counted (its output
  // tokens time D's decode step) and, from a node that prefilled alone, watched (never changed)
  const watch = alone ? usageObserver((u) => (seen = u)) : null;
  // the stream's pace (node-rates.ts learns D's decode step from it), with its output tokens when a usage frame reports them
  const pace = streamPace();
  const responseId = kind === "responses" ? responseIdWatcher(life) : null;
  const source = decodeSource({
    leg: answer.leg,
    reader: answer.body.reader,
    first: answer.body.first,
    rewrite: outputTokensObserver(fix ? usageRewrite(fix) : watch, (n) => (pace.tokens = n)),
    watch: (bytes) => {
      pace.watch(bytes);
      responseId?.(bytes);
    },
    idleMs: config.timeouts.decodeIdleMs,
    completeness: kind === "responses" ? RESPONSES_COMPLETE : DONE_COMPLETE,
    ...(answer.partnerFailure ? { partnerFailure: answer.partnerFailure } : {}),
    // a stream of n > 1 choices interleaves n sequences' tokens: its pace is no step of D's
    onEnd: (end) => endStream(life, answer, typeof body.n === "number" && body.n > 1 ? null : pace, end, kind === "responses"),
  });
  return { source };
}

function decodeLeg(answer: DecodeAnswer, outcome: LegReport["outcome"]): LegReport {
  return { node: answer.decodeNode, outcome, ms: answer.decodeMs };
}

/** Ends the life of a request whose stream ended, with the outcome it ended in. */
function endStream(life: RequestLife, answer: DecodeAnswer, pace: ReturnType<typeof streamPace> | null, end: StreamEnd, responses: boolean): void {
  switch (end.outcome) {
    case "ok":
      if (pace && pace.events > 0)
        life.observe({
          streamEvents: pace.events,
          streamSpanMs: pace.last - pace.first,
          ...(pace.tokens !== undefined ? { streamTokens: pace.tokens } : {}),
          ...(responses ? { streamEventsNotTokens: true } : {}),
        });
      life.end({ status: 200, outcome: "ok", legs: { decode: decodeLeg(answer, "ok") } });
      return;
    case "failure":
      // D's failure counts against D; P's (after D's first byte) against P; a request D found
      // invalid inside its stream, a busy D and a batch's failure against nobody
      life.end({
        status: end.status ?? 502,
        outcome: "error",
        error: end.error,
        legs:
          end.blame === "decode"
            ? { decode: decodeLeg(answer, "failure") }
            : end.blame === "client"
              ? { decode: decodeLeg(answer, "client_error") }
              : end.blame === "busy"
                ? { decode: decodeLeg(answer, "busy") }
                : { decode: decodeLeg(answer, "aborted"), ...(end.prefill ? { prefill: end.prefill } : {}) },
      });
      return;
    case "aborted":
    case "stalled":
      life.end({ status: 499, outcome: end.outcome, error: end.error, legs: { decode: decodeLeg(answer, "aborted") } });
  }
}

/** The client's stream: written as fast as the client reads, cut when it stops reading for CLIENT_STALL_MS. */
export function toClient(c: Ctx, feed: Parameters<typeof clientStream>[0], idleMs: number, requestId: string): ReadableStream<Uint8Array> {
  return clientStream(feed, {
    stallMs: numberVar(c.env.CLIENT_STALL_MS, DEFAULT_CLIENT_STALL_MS, positive),
    idleMs,
    // workerd drops a request's timers and I/O once its client is gone unless waitUntil holds them
    waitUntil: (p) => background(c, p, requestId),
  });
}

export function answerHeaders(requestId: string, routed: Routed[]): Headers {
  const first = routed[0]!;
  const headers = new Headers({
    "x-request-id": requestId,
    "x-pd-prefill": routed.map((r) => r.answer.prefillNode).join(","),
    "x-pd-decode": routed.map((r) => r.answer.decodeNode).join(","),
    // SPEC 8 route receipt: how each request was served (for local, x-pd-prefill names D)
    "x-pd-mode": routed.map((r) => r.life.mode ?? "disaggregated").join(","),
    "server-timing": serverTiming(first.life.timings.routeMs ?? 0, first.answer.prefillMs, first.answer.decodeMs, first.life.timings.queueMs),
  });
  const failOpen = [...new Set(routed.flatMap((r) => r.life.failOpen))];
  if (failOpen.length) {
    headers.set("x-pd-fail-open", failOpen.join(","));
    console.warn(JSON.stringify({ event: "fail_open", requestId, roles: failOpen }));
  }
  return headers;
}

function serverTiming(routeMs: number, prefillMs: number, decodeMs: number, queueMs?: number): string {
  const queue = queueMs === undefined ? "" : `queue;dur=${queueMs}, `;
  return `${queue}route;dur=${routeMs}, prefill;dur=${prefillMs}, decode-ttfb;dur=${decodeMs}`;
}
