// W3C trace context (https://www.w3.org/TR/trace-context/): the client's trace continues through
// the router to both legs (vLLM and SGLang read `traceparent` for their OpenTelemetry spans), or
// the router starts one. The trace id goes into the request's log line.

const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;
const ZERO_TRACE = /^0+$/;

/** 32 random hex digits (a UUID's 122 random bits; the fixed version and variant digits are harmless here). */
const randomHex = () => crypto.randomUUID().replaceAll("-", "");

export interface TraceContext {
  traceId: string;
  /** the client's tracestate, passed on unchanged */
  state: string | null;
  /** the traceparent of an upstream request: the router's span (the parent of every leg), the flags kept */
  child(): string;
}

export function traceContext(traceparent: string | null | undefined, tracestate: string | null | undefined): TraceContext {
  const m = traceparent ? TRACEPARENT.exec(traceparent.trim().toLowerCase()) : null;
  const valid = m && !ZERO_TRACE.test(m[1]!) && !ZERO_TRACE.test(m[2]!);
  const traceId = valid ? m[1]! : randomHex();
  const flags = valid ? m[3]! : "01";
  const state = valid && tracestate ? tracestate.slice(0, 512) : null;
  const spanId = randomHex().slice(16);
  return { traceId, state, child: () => `00-${traceId}-${spanId}-${flags}` };
}
