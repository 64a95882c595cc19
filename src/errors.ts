import type { ContentfulStatusCode } from "hono/utils/http-status";

export type ErrorType = "invalid_request_error" | "authentication_error" | "not_found_error" | "rate_limit_error" | "upstream_error" | "service_unavailable" | "server_error";

/** The one error type of the router; `app.onError` renders it as the OpenAI envelope. */
export class RouterError extends Error {
  constructor(
    readonly status: ContentfulStatusCode,
    message: string,
    readonly type: ErrorType,
    readonly code: string,
    readonly param: string | null = null,
    readonly headers: Record<string, string> = {},
  ) {
    super(message);
    this.name = "RouterError";
  }

  /** already counted and logged by the request's life cycle (src/forward/lifecycle.ts) */
  counted = false;
}

export const badRequest = (message: string, param: string | null, code = "invalid_value") => new RouterError(400, message, "invalid_request_error", code, param);

export interface ErrorEnvelope {
  error: { message: string; type: string; param: string | null; code: string };
}

export function errorEnvelope(err: RouterError): ErrorEnvelope {
  return { error: { message: err.message, type: err.type, param: err.param, code: err.code } };
}

/** An SSE event that ends a stream which failed after it had begun (never a clean [DONE]). */
export function sseErrorEvent(message: string, code = "upstream_stream_error", type: ErrorType = "upstream_error"): string {
  const body: ErrorEnvelope = { error: { message, type, param: null, code } };
  return `event: error\ndata: ${JSON.stringify(body)}\n\n`;
}
