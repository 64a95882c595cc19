import type { MiddlewareHandler } from "hono";
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
