import type { Context } from "hono";
import { Hono } from "hono/tiny";
import { adminAuth } from "../auth/admin-auth";
import { bodyLimit } from "../auth/request-limits";
import { documentETag, writeProblems, type DocumentEdit } from "../config/document-edit";
import { CONFIG_KEY, textVersion } from "../config/load";
import { clusterState, invalidateConfig } from "../config/runtime";
import type { Problem } from "../config/schema";
import type { Env } from "../env";
import { errorEnvelope, RouterError } from "../errors";
import { readClusterStatus } from "../observability/metrics";
import type { AppEnv } from "./app-env";
import { parseJsonObject } from "./request-schema";
import { nodeWarnings } from "../observability/node-warnings";

/** The cluster document is small; anything bigger than this is a mistake. */
const MAX_DOCUMENT_BYTES = 1024 * 1024;
const NODE_ID = /^[A-Za-z0-9._-]{1,64}$/;

/**
 * /admin/*: read and write the cluster document in KV (`NODES`, key `nodes`). Every write is
 * validated first and stored exactly as given (whole-document PUT) or as the edited JSON
 * (single-node operations); nothing invalid is ever written.
 */
export const adminRoutes = new Hono<AppEnv>();

adminRoutes.use("*", adminAuth());
adminRoutes.use(
  "*",
  bodyLimit(
    () => MAX_DOCUMENT_BYTES,
    (max) => new RouterError(413, `The cluster document exceeds ${max} bytes.`, "invalid_request_error", "request_too_large"),
  ),
);

const defaultsOf = (env: Env) => ({ protocol: env.DEFAULT_PROTOCOL, policy: env.DEFAULT_POLICY, plan: env.WORKERS_PLAN });
const readStored = (env: Env) => env.NODES.get(CONFIG_KEY);

/** 400 naming every problem: in the message, and as a `problems` list beside the envelope's fields. */
function invalidDocument(c: Context<AppEnv>, problems: Problem[]): Response {
  const detail = problems.map((p) => `${p.path}: ${p.message}`).join("; ");
  const err = new RouterError(
    400,
    `The cluster document is invalid (nothing was written): ${detail}`,
    "invalid_request_error",
    "invalid_cluster_document",
    problems[0]?.path ?? null,
  );
  return c.json({ error: { ...errorEnvelope(err).error, problems } }, 400);
}

const noDocument = () => new RouterError(404, `No cluster document is stored in KV binding NODES at key "${CONFIG_KEY}".`, "not_found_error", "no_cluster_document");

/** Sends one edit to the Durable Object that serialises document writes, and answers for it. */
async function writeDocument(c: Context<AppEnv>, edit: DocumentEdit): Promise<Response> {
  const result = await clusterState(c.env).editDocument({
    edit,
    ifMatch: c.req.header("if-match") ?? null,
    defaults: defaultsOf(c.env),
    selfOrigin: new URL(c.req.url).origin,
  });
  if (!result.ok) {
    switch (result.kind) {
      case "invalid":
        return invalidDocument(c, result.problems);
      case "precondition_failed":
        throw new RouterError(
          412,
          result.version === null ? "No cluster document is stored; nothing was written." : "The cluster document changed since that ETag; nothing was written.",
          "invalid_request_error",
          "precondition_failed",
          "if-match",
        );
      case "no_document":
        throw noDocument();
      case "unusable_stored_document":
        throw new RouterError(409, "The stored cluster document has no nodes list; PUT /admin/nodes replaces it.", "invalid_request_error", "stored_document_unusable");
      case "node_not_found":
        throw missingNode(result.id);
    }
  }
  invalidateConfig();
  console.log(JSON.stringify({ event: "config_written", requestId: c.get("requestId"), version: result.version, nodes: result.nodes.length }));
  return c.json({ ok: true, version: result.version, nodes: result.nodes }, 200, { etag: documentETag(result.raw) });
}

adminRoutes.get("/nodes", async (c) => {
  const raw = await readStored(c.env);
  if (raw === null) throw noDocument();
  // Exactly as stored, even when invalid, so `curl > nodes.json`, edit, PUT round-trips.
  return c.body(raw, 200, { "content-type": "application/json; charset=utf-8", "cache-control": "no-store", etag: documentETag(raw) });
});

adminRoutes.put("/nodes", async (c) => writeDocument(c, { op: "replace", raw: await c.req.text() }));

adminRoutes.get("/status", async (c) => {
  const raw = await readStored(c.env);
  const problems: Problem[] =
    raw === null
      ? [{ path: "(document)", message: `no cluster document in KV binding NODES at key "${CONFIG_KEY}"` }]
      : writeProblems(raw, defaultsOf(c.env), new URL(c.req.url).origin);
  const { config, snapshot } = await readClusterStatus(c.env);
  return c.json({
    document: { stored: raw !== null, valid: problems.length === 0, problems, version: raw === null ? null : textVersion(raw) },
    serving: {
      version: config.config ? config.version : null,
      stale: config.stale,
      protocol: config.config?.protocol ?? null,
      policy: config.config?.policy ?? null,
    },
    nodes: snapshot.nodes,
    leases: snapshot.leases,
    // cells (docs/scaling.md): each cell's object, its nodes, leases and waiting requests
    ...(snapshot.cells ? { cells: snapshot.cells } : {}),
    warnings: nodeWarnings(snapshot.nodes),
  });
});

// ---- single-node operations: edit one node, validate the whole result, write ----------------
// (applied by the Durable Object one at a time, so concurrent edits never lose one another)

function nodeIdParam(c: Context<AppEnv>): string {
  const id = c.req.param("id") ?? "";
  if (!NODE_ID.test(id)) throw new RouterError(400, "A node id must match [A-Za-z0-9._-]{1,64}.", "invalid_request_error", "invalid_value", "id");
  return id;
}

function missingNode(id: string): RouterError {
  return new RouterError(404, `No node "${id}" in the cluster document.`, "not_found_error", "node_not_found", "id");
}

adminRoutes.put("/nodes/:id", async (c) => {
  const id = nodeIdParam(c);
  const given = parseJsonObject(await c.req.text());
  if (given.id !== undefined && given.id !== id)
    throw new RouterError(400, `The node's id "${String(given.id)}" differs from the id in the path.`, "invalid_request_error", "invalid_value", "id");
  return writeDocument(c, { op: "put_node", id, node: given });
});

adminRoutes.delete("/nodes/:id", (c) => writeDocument(c, { op: "delete_node", id: nodeIdParam(c) }));

adminRoutes.post("/nodes/:id/drain", (c) => writeDocument(c, { op: "drain_node", id: nodeIdParam(c), drain: true }));

adminRoutes.post("/nodes/:id/undrain", (c) => writeDocument(c, { op: "drain_node", id: nodeIdParam(c), drain: false }));
