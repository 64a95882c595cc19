import type { Role } from "../routing/types";
import type { LegReport } from "../state/types";
import { callLeg, UpstreamFailure, type LegResponse, type UpstreamNode } from "./upstream";

/** Everything a protocol needs to run one request's legs; built by the route, free of Hono. */
export interface ForwardContext {
  /** the client's body as sent, and parsed */
  raw: string;
  parsed: Record<string, unknown>;
  /** upstream path, e.g. /v1/chat/completions */
  path: string;
  requestId: string;
  signal: AbortSignal;
  timeouts: { prefillMs: number; decodeFirstByteMs: number };
  /** failover attempts after the first, per leg */
  retries: number;
  /** the nodes chosen so far; failover replaces them */
  chosen: { prefill: string; decode: string };
  resolve(id: string): UpstreamNode;
  /** records the failure and asks the cluster state for the next node; null when there is none */
  failover(role: Role, report: LegReport, wantNext: boolean): Promise<string | null>;
  /** P's part of the lease ends (P answered) */
  prefillDone(report: LegReport): void;
  sleep(ms: number): Promise<void>;
}

export interface ForwardResult {
  prefillNode: string;
  decodeNode: string;
  /** ms until P answered (0 for colocated) */
  prefillMs: number;
  /** D's answer, 2xx, body not yet read */
  decode: LegResponse;
  /** ms until D's response headers */
  decodeMs: number;
  /** cached_tokens reported by P, to show the client */
  cachedTokens: number | null;
  /** sglang: P's leg still runs beside D's; resolves to its failure report (null when it went well) */
  prefillSettled?: Promise<LegReport | null>;
}

/** Jittered exponential backoff between failover attempts (25 ms, 50 ms, ... each +-50%). */
export const backoffMs = (attempt: number) => 25 * 2 ** attempt * (0.5 + Math.random());

/**
 * Runs one leg, failing over to the next-ranked node of its role while the failure is the
 * node's (refused, reset, timeout, 5xx) and attempts remain. Nothing has reached the client
 * yet, so a retry is safe. A failure already reported through failover is marked so the
 * final report does not count it twice.
 */
export async function runLeg<T>(
  ctx: ForwardContext,
  role: Role,
  timeoutMs: number,
  body: (node: UpstreamNode) => string,
  accept: (leg: LegResponse, node: UpstreamNode) => Promise<T>,
): Promise<{ node: UpstreamNode; value: T; ms: number }> {
  for (let attempt = 0; ; attempt++) {
    const node = ctx.resolve(ctx.chosen[role]);
    try {
      const leg = await callLeg({ leg: role, node, path: ctx.path, body: body(node), requestId: ctx.requestId, signal: ctx.signal, timeoutMs });
      try {
        return { node, value: await accept(leg, node), ms: leg.ms };
      } catch (err) {
        leg.abort("rejected");
        throw err;
      }
    } catch (err) {
      if (!(err instanceof UpstreamFailure)) throw err;
      if (!err.retryable) throw err;
      const next = await ctx.failover(role, err.report(), attempt < ctx.retries);
      markReported(err);
      if (next === null || attempt >= ctx.retries) throw err;
      ctx.chosen[role] = next;
      await ctx.sleep(backoffMs(attempt));
    }
  }
}

const reported = new WeakSet<UpstreamFailure>();
export const markReported = (f: UpstreamFailure) => reported.add(f);
export const wasReported = (f: UpstreamFailure) => reported.has(f);
