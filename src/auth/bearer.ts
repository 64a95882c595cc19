import type { Context } from "hono";
import { RouterError } from "../errors";
import { secretEquals } from "./digest";

/** An Authorization header longer than this is refused before anything else looks at it. */
export const MAX_AUTHORIZATION_BYTES = 4096;

/** The token of `Authorization: Bearer <token>` (scheme case-insensitive, RFC 7235), or null. */
export function bearerToken(header: string | undefined | null): string | null {
  if (!header) return null;
  const m = /^bearer[ ]+([^\s].*?)[ ]*$/i.exec(header);
  return m ? m[1]! : null;
}

export const unauthorized = (message: string) =>
  new RouterError(401, message, "authentication_error", "invalid_api_key", null, { "www-authenticate": 'Bearer realm="pd-edge-router"' });

/** A route that is off (its secret is not configured) looks exactly like an unknown route. */
export const routeOff = () => new RouterError(404, "Unknown route.", "not_found_error", "unknown_route");

/** Throws 401 unless the request carries `Authorization: Bearer <expected>`. */
export async function requireBearer(c: Context, expected: string, what: string): Promise<void> {
  const token = bearerToken(c.req.header("authorization"));
  if (token === null) throw unauthorized(`This route needs an 'Authorization: Bearer <${what}>' header.`);
  // Never echo the given token: the message names only what was expected.
  if (!(await secretEquals(token, expected))) throw unauthorized(`The ${what} given is not valid.`);
}

/** Secrets set to an empty or blank string count as unset. */
export function secret(value: unknown): string | null {
  return typeof value === "string" && value.trim() !== "" ? value.trim() : null;
}
