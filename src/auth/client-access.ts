import type { MiddlewareHandler } from "hono";
import { clusterState } from "../config/runtime";
import type { Env } from "../env";
import { RouterError } from "../errors";
import { background } from "../observability/log";
import { bearerToken, secret, unauthorized } from "./bearer";
import { keyLabel, matchesAny } from "./digest";

/** The configured client keys: comma-separated, blanks around keys ignored, empty entries dropped. */
export function apiKeys(env: Env): string[] {
  const raw = secret(env.API_KEYS);
  return raw ? raw.split(",").map((k) => k.trim()).filter((k) => k !== "") : [];
}

export interface ClientAccessOptions {
  /** seconds a limited client is told to wait (the binding's period); default from RATE_LIMIT_PERIOD_S or 60 */
  retryAfterSeconds?: number;
}

/**
 * `/v1/*`: client auth when `API_KEYS` is set (the key is only ever read from the
 * Authorization header, never from the URL), then optional rate limiting with the
 * `RATE_LIMITER` binding, keyed by the key's hash, or the client IP when auth is off.
 */
const INFERENCE_PATHS = new Set(["/v1/chat/completions", "/v1/completions"]);

export function clientAccess(options: ClientAccessOptions = {}): MiddlewareHandler<{ Bindings: Env; Variables: { keyLabel?: string } }> {
  return async function clientAccess(c, next) {
    const keys = apiKeys(c.env);
    let label: string | null = null;
    if (keys.length > 0) {
      const token = bearerToken(c.req.header("authorization"));
      if (token === null) throw unauthorized("You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.");
      if (!(await matchesAny(token, keys))) throw unauthorized("Incorrect API key provided.");
      label = await keyLabel(token);
      // Routed requests carry the label to the Durable Object in their finish report (no
      // extra round trip); the other /v1 routes count it here.
      if (INFERENCE_PATHS.has(c.req.path)) c.set("keyLabel", label);
      else background(c, clusterState(c.env).countKey(label));
    }

    const limiter = c.env.RATE_LIMITER;
    if (limiter) {
      const ip = c.req.header("cf-connecting-ip");
      const key = label !== null ? `key:${label}` : ip ? `ip:${ip}` : null;
      if (key !== null) {
        const outcome = await limiter.limit({ key }).catch((err: unknown) => {
          // A broken limiter must not take the API down: fail open, loudly.
          console.error(JSON.stringify({ event: "rate_limiter_failed", error: String(err) }));
          return { success: true };
        });
        if (!outcome.success) {
          const retryAfter = options.retryAfterSeconds ?? periodSeconds(c.env.RATE_LIMIT_PERIOD_S);
          throw new RouterError(429, "Rate limit reached for requests. Retry after the time given in the retry-after header.", "rate_limit_error", "rate_limit_exceeded", null, {
            "retry-after": String(retryAfter),
          });
        }
      }
    }
    await next();
  };
}

function periodSeconds(value: unknown): number {
  const n = Number(value);
  return Number.isInteger(n) && n > 0 ? n : 60;
}
