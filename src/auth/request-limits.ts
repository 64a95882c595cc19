import type { MiddlewareHandler } from "hono";
import type { Env } from "../env";
import { RouterError } from "../errors";
import { MAX_AUTHORIZATION_BYTES } from "./bearer";

/** All request headers together (names and values) may not exceed this. */
export const MAX_HEADER_BYTES = 32 * 1024;

export interface HeaderLimitsOptions {
  maxAuthorizationBytes?: number;
  maxHeaderBytes?: number;
}

/** Refuses oversized headers up front (431), before any of them is parsed or compared. */
export function headerLimits({ maxAuthorizationBytes = MAX_AUTHORIZATION_BYTES, maxHeaderBytes = MAX_HEADER_BYTES }: HeaderLimitsOptions = {}): MiddlewareHandler {
  return async function headerLimits(c, next) {
    const auth = c.req.header("authorization");
    if (auth !== undefined && auth.length > maxAuthorizationBytes) {
      throw new RouterError(431, `The Authorization header exceeds ${maxAuthorizationBytes} bytes.`, "invalid_request_error", "header_too_large", "authorization");
    }
    let total = 0;
    c.req.raw.headers.forEach((value, name) => {
      total += name.length + value.length + 4;
    });
    if (total > maxHeaderBytes) {
      throw new RouterError(431, `The request headers exceed ${maxHeaderBytes} bytes.`, "invalid_request_error", "header_too_large");
    }
    await next();
  };
}

/**
 * Refuses a body over `max` bytes (413): by its content-length, or, sent chunked, counted as it
 * arrives and cut off there (the handler then reads the bytes kept). Hono's bodyLimit, smaller.
 */
export function bodyLimit<E extends { Bindings: Env }>(max: (env: Env) => number, tooLarge: (max: number) => RouterError): MiddlewareHandler<E> {
  return async function bodyLimit(c, next) {
    const raw = c.req.raw;
    if (!raw.body) return next();
    const limit = max(c.env);
    if (raw.headers.has("content-length") && !raw.headers.has("transfer-encoding")) {
      if (Number.parseInt(raw.headers.get("content-length") || "0", 10) > limit) throw tooLarge(limit);
      return next();
    }
    const chunks: Uint8Array[] = [];
    let size = 0;
    for await (const chunk of raw.body as unknown as AsyncIterable<Uint8Array>) {
      size += chunk.byteLength;
      if (size > limit) throw tooLarge(limit);
      chunks.push(chunk);
    }
    c.req.raw = new Request(raw, { body: new Blob(chunks) });
    return next();
  };
}
