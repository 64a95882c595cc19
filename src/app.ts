import { Hono } from "hono/tiny";
import { currentConfig, maxBodyBytes, requireConfig } from "./config/runtime";
import { errorEnvelope, RouterError } from "./errors";
import type { AppEnv } from "./routes/app-env";
import { explainRoute } from "./routes/explain";
import { forwardGenerate, forwardInference, forwardOneHop } from "./routes/inference";
import { listModels } from "./routes/models";
import { clientAccess } from "./auth/client-access";
import { bodyLimit, headerLimits } from "./auth/request-limits";
import { recordAnswered, recordRejected } from "./observability/metrics";
import { adminRoutes } from "./routes/admin";
import { metricsRoutes } from "./routes/metrics";
import { statusRoutes } from "./routes/status";
import { HOP_HEADER } from "./forward/upstream";

const REQUEST_ID = /^[\x21-\x7e]{1,128}$/;
/** Routes whose requests take a lease: the Durable Object counts them when they finish. */
const ROUTED_PATHS = new Set(["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings", "/tokenize", "/detokenize", "/generate"]);

export const app = new Hono<AppEnv>();

app.use(async function requestId(c, next) {
  const given = c.req.header("x-request-id");
  const id = given && REQUEST_ID.test(given) ? given : crypto.randomUUID();
  c.set("requestId", id);
  await next();
  c.res.headers.set("x-request-id", id);
});

app.use(headerLimits());
// The router's own upstream requests carry HOP_HEADER: one arriving here went round in a loop
// (a node URL pointing back at the router, directly or through a proxy).
app.use(async function loopGuard(c, next) {
  if (c.req.header(HOP_HEADER) !== undefined) {
    throw new RouterError(508, "A node URL points at the router itself (a routing loop).", "server_error", "routing_loop");
  }
  await next();
});
// The API surface clients call: the OpenAI routes and the engines' native ones the router serves.
const CLIENT_ROUTES = ["/v1/*", "/tokenize", "/detokenize", "/generate"];
for (const path of CLIENT_ROUTES) app.use(path, clientAccess());
app.use("/v1/*", async function countAnswered(c, next) {
  await next();
  // Routed inference requests are counted by the Durable Object when they finish; errors in onError.
  if (!c.error && c.res.status < 400 && !ROUTED_PATHS.has(c.req.path)) recordAnswered(c, c.res.status);
});

const limitBody = bodyLimit<AppEnv>(
  maxBodyBytes,
  (max) => new RouterError(413, `The request body exceeds the limit of ${max} bytes.`, "invalid_request_error", "request_too_large"),
);
for (const path of CLIENT_ROUTES) app.use(path, (c, next) => (c.req.method === "POST" ? limitBody(c, next) : next()));

// Hono's tiny preset (its small router keeps the Worker small) would also match "/x/" for "/x":
// keep every route exact, as the default router did.
app.use(async function exactPath(c, next) {
  if (c.req.path.length > 1 && c.req.path.endsWith("/")) return c.notFound();
  await next();
});

app.get("/healthz", (c) => c.json({ status: "ok" }));

app.get("/v1/models", async (c) => {
  const config = requireConfig(await currentConfig(c.env));
  const models = await listModels(config, { env: c.env });
  return c.json({ object: "list", data: models.map((id) => ({ id, object: "model", created: 0, owned_by: "pd-edge-router" })) });
});

app.post("/v1/chat/completions", (c) => forwardInference(c, "chat", "/v1/chat/completions"));
app.post("/v1/completions", (c) => forwardInference(c, "completion", "/v1/completions"));
app.post("/v1/responses", (c) => forwardInference(c, "responses", "/v1/responses"));
app.post("/v1/embeddings", (c) => forwardOneHop(c, "/v1/embeddings", true));
app.post("/tokenize", (c) => forwardOneHop(c, "/tokenize", false));
app.post("/detokenize", (c) => forwardOneHop(c, "/detokenize", false));
app.post("/generate", (c) => forwardGenerate(c));

app.post("/v1/route", async (c) => explainRoute(c, await c.req.text()));

app.route("/admin", adminRoutes);
app.route("/", metricsRoutes);
app.route("/", statusRoutes);

app.notFound(() => {
  throw new RouterError(404, "Unknown route.", "not_found_error", "unknown_route");
});

// Every refusal of the router's own is a RouterError (no Hono middleware that throws HTTPException is used).
app.onError((err, c) => {
  const error = err instanceof RouterError ? err : new RouterError(500, "Internal error in the router.", "server_error", "internal_error");
  if (error !== err) console.error(JSON.stringify({ event: "unhandled_error", requestId: c.get("requestId"), error: String(err) }));
  recordRejected(c, error);
  return c.json(errorEnvelope(error), error.status, { ...error.headers, "x-request-id": c.get("requestId") ?? "" });
});
