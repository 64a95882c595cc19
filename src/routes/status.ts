import { Hono } from "hono/tiny";
import { adminAuth, statusIsPublic } from "../auth/admin-auth";
import { bearerToken, routeOff, secret, unauthorized } from "../auth/bearer";
import { secretEquals } from "../auth/digest";
import { readClusterStatus } from "../observability/metrics";
import { nodeWarnings } from "../observability/node-warnings";
import type { AppEnv } from "./app-env";
import { statusPage } from "./status-page";

/**
 * GET /status (HTML) and GET /status.json (its data). Both are off without ADMIN_TOKEN unless
 * STATUS_PUBLIC is "true". The page itself holds no data, so a browser may load it without a
 * header and then log in; the data needs the bearer token (unless public).
 */
export const statusRoutes = new Hono<AppEnv>();

statusRoutes.get("/status", async (c) => {
  const isPublic = statusIsPublic(c.env);
  if (!isPublic) {
    const token = secret(c.env.ADMIN_TOKEN);
    if (!token) throw routeOff();
    // A header that is present must be right; without one the page asks for the token.
    const given = c.req.header("authorization");
    if (given !== undefined && !(await secretEquals(bearerToken(given) ?? "", token))) throw unauthorized("The ADMIN_TOKEN given is not valid.");
  }
  const { html, headers } = await statusPage({ isPublic, assets: c.env.ASSETS });
  return c.html(html, 200, headers);
});

statusRoutes.get("/status.json", adminAuth({ isPublic: statusIsPublic }), async (c) => {
  const { config, snapshot } = await readClusterStatus(c.env, { history: true });
  return c.json(
    {
      now: snapshot.now,
      config: {
        valid: config.problems.length === 0,
        stale: config.stale,
        problems: config.problems,
        version: config.config ? config.version : null,
        protocol: config.config?.protocol ?? null,
        policy: config.config?.policy ?? null,
      },
      nodes: snapshot.nodes.map((n) => ({
        id: n.id,
        roles: n.roles,
        group: n.group,
        weight: n.weight,
        drain: n.drain,
        healthy: n.healthy,
        probeUp: n.probeUp,
        breaker: n.breaker,
        inflight: n.inflight,
        requestsTotal: n.requestsTotal,
        failuresTotal: n.failuresTotal,
        // the page marks an ejection when this moves forward (a re-ejection between two polls too)
        ejectedUntil: n.ejectedUntil,
        busyUntil: n.busyUntil,
        lastFailureAt: n.lastFailureAt,
        // the engine's last /metrics reading and the projection routing uses (null: never polled)
        signals: n.signals,
        usageDetails: n.usageDetails,
        // answers its probes but its /metrics gives no reading (SGLang without --enable-metrics)
        noSignals: n.noSignals ?? false,
        // learned rates (SPEC 9): prefill tokens/s at context 0, decode step ms, KV transfer ms a GB
        rates: n.rates ?? null,
        // cells (docs/scaling.md): the cell the node is in
        ...(n.cell ? { cell: n.cell } : {}),
      })),
      ...(snapshot.cells ? { cells: snapshot.cells } : {}),
      warnings: nodeWarnings(snapshot.nodes),
      // the last 15 minutes of per-node in-flight, KV use and queue, so the charts start filled
      history: snapshot.history,
      admission: { queued: snapshot.admission.queued, queuedByTier: snapshot.admission.queuedByTier ?? [], rejected: snapshot.admission.rejected },
      decisions: snapshot.decisions,
      // where each request was prefilled and why (x-pd-mode, its reason): the page lists those seen
      disagg: snapshot.disagg,
      requests: snapshot.requests,
      prefix: snapshot.prefix,
      // SPEC 9: follow-up turns that landed on a node holding their prefix, per pool, last 15 minutes
      precision: snapshot.precision ?? [],
      // sharded /metrics polling (docs/scaling.md): each poller object, its pool, its nodes and how long since it pushed
      pollers: snapshot.pollers ?? [],
      // cumulative histograms (seconds): the page derives p50/p99 over its own recent window
      latency: snapshot.latency,
      leases: snapshot.leases,
    },
    200,
    { "cache-control": "no-store" },
  );
});
