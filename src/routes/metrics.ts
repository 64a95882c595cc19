import { Hono } from "hono/tiny";
import { requireBearer, secret } from "../auth/bearer";
import { clusterMetrics, readClusterStatus } from "../observability/metrics";
import { PROMETHEUS_CONTENT_TYPE, renderMetrics } from "../observability/prometheus";
import type { AppEnv } from "./app-env";

/** GET /metrics: Prometheus text from the Durable Object's shared state; METRICS_TOKEN guards it when set. */
export const metricsRoutes = new Hono<AppEnv>();

metricsRoutes.get("/metrics", async (c) => {
  const token = secret(c.env.METRICS_TOKEN);
  if (token) await requireBearer(c, token, "METRICS_TOKEN");
  const { config, snapshot, keys } = await readClusterStatus(c.env);
  const text = renderMetrics(
    clusterMetrics({
      snapshot,
      keys,
      config: { valid: config.problems.length === 0, stale: config.stale, problems: config.problems.length, served: config.config !== null },
    }),
  );
  return c.body(text, 200, { "content-type": PROMETHEUS_CONTENT_TYPE, "cache-control": "no-store" });
});
