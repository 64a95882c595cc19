import type { MiddlewareHandler } from "hono";
import type { Env } from "../env";
import { requireBearer, routeOff, secret } from "./bearer";

export interface AdminAuthOptions {
  /** when true for this env, the route is open to anyone (the public status page) */
  isPublic?: (env: Env) => boolean;
}

/**
 * Operator routes: `Authorization: Bearer <ADMIN_TOKEN>`. With no ADMIN_TOKEN configured they
 * are off (404, as if they did not exist) rather than open.
 */
export function adminAuth({ isPublic = () => false }: AdminAuthOptions = {}): MiddlewareHandler<{ Bindings: Env }> {
  return async function adminAuth(c, next) {
    if (!isPublic(c.env)) {
      const token = secret(c.env.ADMIN_TOKEN);
      if (!token) throw routeOff();
      await requireBearer(c, token, "ADMIN_TOKEN");
    }
    await next();
  };
}

export const statusIsPublic = (env: Env) => env.STATUS_PUBLIC === "true";
