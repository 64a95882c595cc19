import type { Context } from "hono";
import type { ClientKey } from "../auth/client-access";
import type { Env } from "../env";

/** The Hono app's bindings and the per-request variables its middleware sets. */
export type AppEnv = { Bindings: Env; Variables: { requestId: string; keyLabel?: string; rateLimitKey?: string; clientKey?: ClientKey } };
/** One request's Hono context, passed to every step of its life cycle. */
export type Ctx = Context<AppEnv>;
