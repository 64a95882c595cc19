import type { MiddlewareHandler } from "hono";
import { clusterState, numberVar } from "../config/runtime";
import type { Env } from "../env";
import { RouterError } from "../errors";
import { background } from "../observability/log";
import { bearerToken, secret, unauthorized } from "./bearer";
import { keyLabel, matchIndex } from "./digest";
import { parseKeyEntry } from "./service-tier";
import type { Tier } from "../state/admission-queue";

/**
 * The configured client keys: comma-separated, blanks around keys ignored, empty entries dropped;
 * an entry may end in `:tier` (`key-abc:priority`, SPEC 9), the key's service tier.
 */
export function apiKeys(env: Env): Array<{ key: string; tier: Tier | null }> {
  const raw = secret(env.API_KEYS);
  return raw
    ? raw
        .split(",")
        .map((k) => parseKeyEntry(k.trim()))
        .filter((k) => k.key !== "")
    : [];
}

/** The client's key as the routes see it: its label (metrics, fair share) and its tier, if it has one. */
export interface ClientKey {
  label: string;
  tier: Tier | null;
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

type AccessEnv = { Bindings: Env; Variables: { keyLabel?: string; rateLimitKey?: string; clientKey?: ClientKey } };

export function clientAccess(options: ClientAccessOptions = {}): MiddlewareHandler<AccessEnv> {
  return async function clientAccess(c, next) {
    const keys = apiKeys(c.env);
    let label: string | null = null;
    if (keys.length > 0) {
      const token = bearerToken(c.req.header("authorization"));
      if (token === null) throw unauthorized("You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.");
      const failures = failureLimit(c.env, c.req.header("cf-connecting-ip"), options);
      // Checked before the key: an address over its limit learns nothing from a right guess either.
      failures?.refuseIfBlocked();
      const matched =
        keys[
          await matchIndex(
            token,
            keys.map((k) => k.key),
          )
        ];
      if (!matched) {
        await failures?.count();
        throw unauthorized("Incorrect API key provided.");
      }
      label = await keyLabel(token);
      c.set("clientKey", { label, tier: matched.tier });
      // Routed requests carry the label to the Durable Object in their finish report (no
      // extra round trip); the other /v1 routes count it here.
      if (INFERENCE_PATHS.has(c.req.path)) c.set("keyLabel", label);
      else background(c, clusterState(c.env).countKey(label));
    }

    const ip = c.req.header("cf-connecting-ip");
    const key = label !== null ? `key:${label}` : ip ? `ip:${ip}` : null;
    if (key !== null && c.env.RATE_LIMITER) {
      c.set("rateLimitKey", key);
      await chargeRateLimit(c.env, key, 1, options);
    }
    await next();
  };
}

/** One call to the limiter; a broken limiter must not take the API down: fail open, loudly. */
const limitOrPass = (limiter: RateLimit, key: string) =>
  limiter.limit({ key }).catch((err: unknown) => {
    console.error(JSON.stringify({ event: "rate_limiter_failed", error: String(err) }));
    return { success: true };
  });

/**
 * Counts `requests` more against the caller's limit (RATE_LIMITER, the key the middleware
 * chose, `rateLimitKey`): one for every request, and a batched /v1/completions one more for each further
 * prompt — each prompt is a request to the GPUs. The binding counts one a call and has no
 * weight, so it is called once a request counted, in parallel. Throws 429 when over the limit.
 */
export async function chargeRateLimit(env: Env, key: string | undefined, requests: number, options: ClientAccessOptions = {}): Promise<void> {
  const limiter = env.RATE_LIMITER;
  if (!limiter || !key || requests < 1) return;
  const outcomes = await Promise.all(Array.from({ length: requests }, () => limitOrPass(limiter, key)));
  if (outcomes.every((o) => o.success)) return;
  const retryAfter = options.retryAfterSeconds ?? periodSeconds(env.RATE_LIMIT_PERIOD_S);
  throw new RouterError(429, "Rate limit reached for requests.", "rate_limit_error", "rate_limit_exceeded", null, {
    "retry-after": String(retryAfter),
  });
}

/**
 * Wrong API keys are rate-limited per client IP with the RATE_LIMITER binding (key
 * `auth-fail:ip:<ip>`), so guessing keys is not free. An address that goes over the limit is
 * refused (429) for the binding's period in this isolate, before its key is even compared. The
 * binding cannot be asked without counting, so the isolate remembers the refusal: plain data,
 * bounded, never a pending promise shared between requests.
 */
const blockedUntil = new Map<string, number>();
const MAX_BLOCKED = 10_000;

/** Test seam: no address blocked, as in a new isolate (the Worker tests share one isolate across files). */
export const forgetBlockedForTests = () => blockedUntil.clear();

function failureLimit(env: Env, ip: string | undefined, options: ClientAccessOptions) {
  const limiter = env.RATE_LIMITER;
  if (!limiter) return null;
  const key = `auth-fail:ip:${ip ?? "unknown"}`;
  const retryAfter = options.retryAfterSeconds ?? periodSeconds(env.RATE_LIMIT_PERIOD_S);
  const tooMany = () =>
    new RouterError(429, "Too many incorrect API keys from this address.", "rate_limit_error", "too_many_failed_auth", null, {
      "retry-after": String(retryAfter),
    });
  return {
    refuseIfBlocked(): void {
      const until = blockedUntil.get(key);
      if (until === undefined) return;
      if (Date.now() < until) throw tooMany();
      blockedUntil.delete(key);
    },
    async count(): Promise<void> {
      const outcome = await limitOrPass(limiter, key);
      if (outcome.success) return;
      if (blockedUntil.size >= MAX_BLOCKED) blockedUntil.delete(blockedUntil.keys().next().value as string);
      blockedUntil.set(key, Date.now() + retryAfter * 1000);
      throw tooMany();
    },
  };
}

const periodSeconds = (value: string | undefined) => numberVar(value, 60, (n) => Number.isInteger(n) && n > 0);
