/**
 * One JSON object per line per request (Workers Logs / `wrangler tail` pick it up).
 * Never prompt text or keys: only ids, hashes, timings and outcomes.
 */
export interface RequestLog {
  requestId: string;
  traceId?: string | undefined;
  route: string;
  model?: string | undefined;
  policy?: string | undefined;
  prefill?: string | undefined;
  decode?: string | undefined;
  keyHash?: string | null | undefined;
  keySource?: string | null | undefined;
  rule?: string | undefined;
  /** how it was served (disaggregated, local, colocated) and why (SPEC 8 reasons) */
  mode?: string | undefined;
  reason?: string | undefined;
  /** the prompt's tokens D was predicted not to hold */
  uncachedTokens?: number | undefined;
  status: number;
  outcome: string;
  routeMs?: number | undefined;
  /** time waited at the edge for a decode node that is not busy (admission queue) */
  queueMs?: number | undefined;
  prefillMs?: number | undefined;
  decodeTtfbMs?: number | undefined;
  /** predicted disaggregation's TTFT for the option taken, and the TTFT measured (ms from the first leg sent to D's first byte) */
  predictedTtftMs?: number | undefined;
  ttftMs?: number | undefined;
  totalMs: number;
  /** Durable Object calls of the request, and how many the response waited for */
  stateCalls?: number | undefined;
  stateCallsBeforeResponse?: number | undefined;
  failOpen?: string[] | undefined;
  error?: string | undefined;
}

/** The request's line; JSON.stringify leaves out the fields that are undefined. */
export function logRequest(entry: RequestLog): void {
  console.log(JSON.stringify({ event: "request", ...entry }));
}

/**
 * Runs a Durable Object call (or any promise) past the response with waitUntil, logging a
 * failure instead of letting it reject unseen. Without an execution context (app.request in
 * unit tests) the promise still runs.
 */
export function background(c: { executionCtx: { waitUntil(promise: Promise<unknown>): void } }, promise: Promise<unknown>, requestId?: string): void {
  const guarded = promise.catch((err) => console.error(JSON.stringify({ event: "state_call_failed", requestId, error: String(err) })));
  try {
    c.executionCtx.waitUntil(guarded);
  } catch {
    // no execution context: nothing to extend
  }
}
