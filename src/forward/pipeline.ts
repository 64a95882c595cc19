import type { Role } from "../routing/types";
import { readFirstEvent, RESPONSES_PREAMBLE } from "./decode-source";
import type { RequestLife } from "./lifecycle";
import { withPriority } from "./priority";
import type { PrefillUsage } from "./stream";
import { Leg, UpstreamFailure, type UpstreamNode } from "./upstream";

/** Everything a protocol needs to run one request's legs; built by the route, free of Hono. */
export interface ForwardContext {
  /** the client's body as sent, and parsed */
  raw: string;
  parsed: Record<string, unknown>;
  /** upstream path, e.g. /v1/chat/completions */
  path: string;
  /** the client asked for a stream */
  stream: boolean;
  life: RequestLife;
  timeouts: { prefillMs: number; decodeFirstByteMs: number; decodeIdleMs: number; nonStreamMs: number };
  /** failover attempts after the first, per leg */
  retries: number;
  resolve(id: string): UpstreamNode;
  /** vLLM's `priority` for this request on that node, or undefined when the node runs no priority scheduling (forward/priority.ts) */
  priorityOf?(id: string): number | undefined;
  /** whether this decode node tells P itself when its serving layer drops a handle (vLLM >= 0.21: handle-release.ts); absent: true */
  decodeNotifiesP?(id: string): boolean;
  sleep(ms: number): Promise<void>;
  /** the shortest retry-after the busy nodes of this request gave (ms), for the client should all be busy */
  busyRetryAfterMs?: number;
}

/** D's answer, ready for the client: a stream whose first bytes arrived, or a whole JSON body. */
export interface DecodeAnswer {
  prefillNode: string;
  decodeNode: string;
  /** ms until P answered (0 when P runs beside D or there is none) */
  prefillMs: number;
  /** ms from sending D to its first body byte */
  decodeMs: number;
  leg: Leg;
  body: { kind: "stream"; reader: ReadableStreamDefaultReader<Uint8Array>; first: Uint8Array } | { kind: "json"; text: string };
  /** vllm: P's token counts, which the client's usage must show */
  prefillUsage: PrefillUsage | null;
  /** sglang, vllm-mooncake: P's failure once P failed after D's answer began (P and D run at once) */
  partnerFailure?: () => UpstreamFailure | null;
}

/** Jittered exponential backoff between failover attempts (25 ms, 50 ms, ... each +-50%). */
export const backoffMs = (attempt: number) => 25 * 2 ** attempt * (0.5 + Math.random());

const reported = new WeakSet<UpstreamFailure>();
export const markReported = (f: UpstreamFailure) => reported.add(f);
export const wasReported = (f: UpstreamFailure) => reported.has(f);

/**
 * After a failed attempt: records the failure and moves the role to its next-ranked node
 * while the failure is the node's (refused, reset, timeout, node-fault status) and attempts
 * remain. Nothing has reached the client yet, so a retry is safe. Throws the failure when
 * there is nothing left to try.
 */
export async function failOver(ctx: ForwardContext, failure: UpstreamFailure, attempt: number): Promise<void> {
  // the node's own retry-after, before the client's replaces it below
  const report = failure.report();
  if (failure.outcome === "busy") {
    // the client's retry-after, should every node be busy: the soonest any of them named
    ctx.busyRetryAfterMs = Math.min(ctx.busyRetryAfterMs ?? Infinity, failure.retryAfterMs ?? Infinity);
    failure.retryAfterMs = Number.isFinite(ctx.busyRetryAfterMs) ? ctx.busyRetryAfterMs : null;
  }
  if (!failure.retryable || ctx.life.isEnded) throw failure;
  const next = await ctx.life.failover(failure.leg, report, attempt < ctx.retries);
  markReported(failure);
  if (next === null || attempt >= ctx.retries) throw failure;
  await ctx.sleep(backoffMs(attempt));
}

export function asFailure(err: unknown, role: Role, node: string): UpstreamFailure {
  if (err instanceof UpstreamFailure) return err;
  return new UpstreamFailure(role, node, "protocol", `${role} node ${node}: ${(err as Error)?.message ?? String(err)}`);
}

/** Runs `attempt` on the role's current node, failing over to the next-ranked ones. */
export async function withFailover<T>(ctx: ForwardContext, role: Role, attempt: (node: UpstreamNode) => Promise<T>): Promise<T> {
  for (let i = 0; ; i++) {
    const node = ctx.resolve(ctx.life.chosen[role]);
    try {
      return await attempt(node);
    } catch (err) {
      await failOver(ctx, asFailure(err, role, node.id), i);
    }
  }
}

export function sendLeg(
  ctx: ForwardContext,
  role: Role,
  node: UpstreamNode,
  body: string,
  upstreamId: string,
  timeoutMs: number,
  signal = ctx.life.signal,
  headers?: Record<string, string>,
): Promise<Leg> {
  // set per node: a failover to a node without priority scheduling must not carry it
  const priority = ctx.priorityOf?.(node.id);
  const sent = priority === undefined ? body : withPriority(body, priority);
  return Leg.send({ leg: role, node, path: ctx.path, body: sent, upstreamId, trace: ctx.life.trace, signal, timeoutMs, headers });
}

/**
 * Runs one decode attempt until the client can be answered: for a stream, D's first body byte
 * (engines send headers before the first token, so headers alone prove nothing) within
 * decodeFirstByteMs; otherwise the whole JSON answer within nonStreamMs — a non-streamed
 * answer's first byte is its last, and a body cut short must not reach the client as a 200.
 */
export async function decodeAttempt(
  ctx: ForwardContext,
  node: UpstreamNode,
  body: string,
  upstreamId: string,
  signal = ctx.life.signal,
): Promise<{ leg: Leg; ms: number; body: DecodeAnswer["body"] }> {
  const timeoutMs = ctx.stream ? ctx.timeouts.decodeFirstByteMs : ctx.timeouts.nonStreamMs;
  const leg = await sendLeg(ctx, "decode", node, body, upstreamId, timeoutMs, signal);
  try {
    if (!ctx.stream) {
      const text = await leg.text();
      leg.close();
      try {
        // an object; an array only for a batched native /generate
        const value: unknown = JSON.parse(text);
        if (!value || typeof value !== "object") throw new Error("not JSON");
      } catch {
        throw leg.protocolFailure("answered a body that is not complete JSON");
      }
      return { leg, ms: Date.now() - leg.started, body: { kind: "json", text } };
    }
    const type = leg.response.headers.get("content-type") ?? "";
    if (!type.includes("text/event-stream") || !leg.response.body) throw leg.protocolFailure(`answered a stream request with '${type || "no body"}'`);
    const reader = leg.bodyReader();
    // the first byte, and the first event unless it is D's error (decode-source.ts)
    const first = await readFirstEvent(leg, reader, ctx.timeouts.decodeIdleMs, ctx.path === "/v1/responses" ? RESPONSES_PREAMBLE : undefined);
    return { leg, ms: Date.now() - leg.started, body: { kind: "stream", reader, first } };
  } catch (err) {
    leg.abort("attempt failed");
    throw err;
  }
}
