import { Hono, type Context } from "hono";
import { bodyLimit } from "hono/body-limit";
import { adminAuth } from "../auth/admin-auth";
import { CONFIG_KEY, textVersion } from "../config/load";
import { invalidateConfig } from "../config/runtime";
import { parseClusterDocument, type Problem } from "../config/schema";
import type { Env } from "../env";
import { errorEnvelope, RouterError } from "../errors";
import { readClusterStatus } from "../observability/metrics";
import type { AppEnv } from "./inference";

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
  bodyLimit({
    maxSize: MAX_DOCUMENT_BYTES,
    onError: () => {
      throw new RouterError(413, `The cluster document exceeds ${MAX_DOCUMENT_BYTES} bytes.`, "invalid_request_error", "request_too_large");
    },
  }),
);

const defaultsOf = (env: Env) => ({ protocol: env.DEFAULT_PROTOCOL, policy: env.DEFAULT_POLICY });
const readStored = (env: Env) => env.NODES.get(CONFIG_KEY);

/** 400 naming every problem: in the message, and as a `problems` list beside the envelope's fields. */
function invalidDocument(c: Context<AppEnv>, problems: Problem[]): Response {
  const detail = problems.map((p) => `${p.path}: ${p.message}`).join("; ");
  const err = new RouterError(400, `The cluster document is invalid (nothing was written): ${detail}`, "invalid_request_error", "invalid_cluster_document", problems[0]?.path ?? null);
  return c.json({ error: { ...errorEnvelope(err).error, problems } }, 400);
}

async function writeDocument(c: Context<AppEnv>, raw: string): Promise<Response> {
  const parsed = parseClusterDocument(raw, defaultsOf(c.env));
  if (!parsed.ok) return invalidDocument(c, parsed.problems);
  await c.env.NODES.put(CONFIG_KEY, raw);
  invalidateConfig();
  console.log(JSON.stringify({ event: "config_written", requestId: c.get("requestId"), version: textVersion(raw), nodes: parsed.config.nodes.length }));
  return c.json({ ok: true, version: textVersion(raw), nodes: parsed.config.nodes.map((n) => n.id) });
}

adminRoutes.get("/nodes", async (c) => {
  const raw = await readStored(c.env);
  if (raw === null) throw new RouterError(404, `No cluster document is stored in KV binding NODES at key "${CONFIG_KEY}".`, "not_found_error", "no_cluster_document");
  // Exactly as stored, even when invalid, so `curl > nodes.json`, edit, PUT round-trips.
  return c.body(raw, 200, { "content-type": "application/json; charset=utf-8", "cache-control": "no-store" });
});

adminRoutes.put("/nodes", async (c) => writeDocument(c, await c.req.text()));

adminRoutes.get("/status", async (c) => {
  const raw = await readStored(c.env);
  const parsed = raw === null ? null : parseClusterDocument(raw, defaultsOf(c.env));
  const problems: Problem[] =
    raw === null ? [{ path: "(document)", message: `no cluster document in KV binding NODES at key "${CONFIG_KEY}"` }] : parsed && !parsed.ok ? parsed.problems : [];
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
  });
});

// ---- single-node operations: read, edit one node, validate the whole result, write -------

type Doc = Record<string, unknown> & { nodes: Array<Record<string, unknown>> };

async function storedDocument(env: Env): Promise<Doc | null> {
  const raw = await readStored(env);
  if (raw === null) return null;
  let value: unknown;
  try {
    value = JSON.parse(raw);
  } catch {
    value = null;
  }
  const doc = value as Doc | null;
  if (!doc || typeof doc !== "object" || Array.isArray(doc) || !Array.isArray(doc.nodes) || !doc.nodes.every((n) => n && typeof n === "object")) {
    throw new RouterError(409, "The stored cluster document is not a JSON object with a nodes list; replace it with PUT /admin/nodes first.", "invalid_request_error", "stored_document_unusable");
  }
  return doc;
}

function nodeIdParam(c: Context<AppEnv>): string {
  const id = c.req.param("id") ?? "";
  if (!NODE_ID.test(id)) throw new RouterError(400, "A node id must match [A-Za-z0-9._-]{1,64}.", "invalid_request_error", "invalid_value", "id");
  return id;
}

function missingNode(id: string): RouterError {
  return new RouterError(404, `No node "${id}" in the cluster document.`, "not_found_error", "node_not_found", "id");
}

async function editNode(c: Context<AppEnv>, edit: (doc: Doc, index: number, id: string) => void, createIfMissing = false): Promise<Response> {
  const id = nodeIdParam(c);
  const doc = (await storedDocument(c.env)) ?? (createIfMissing ? ({ nodes: [] } as Doc) : null);
  if (!doc) throw new RouterError(404, `No cluster document is stored in KV binding NODES at key "${CONFIG_KEY}".`, "not_found_error", "no_cluster_document");
  const index = doc.nodes.findIndex((n) => n.id === id);
  if (index < 0 && !createIfMissing) throw missingNode(id);
  edit(doc, index, id);
  return writeDocument(c, JSON.stringify(doc, null, 2));
}

adminRoutes.put("/nodes/:id", async (c) => {
  let node: unknown;
  try {
    node = JSON.parse(await c.req.text());
  } catch {
    throw new RouterError(400, "The body must be one node as a JSON object.", "invalid_request_error", "invalid_json");
  }
  if (!node || typeof node !== "object" || Array.isArray(node)) throw new RouterError(400, "The body must be one node as a JSON object.", "invalid_request_error", "invalid_json");
  const given = node as Record<string, unknown>;
  const pathId = c.req.param("id");
  if (given.id !== undefined && given.id !== pathId) throw new RouterError(400, `The node's id "${String(given.id)}" differs from the id in the path.`, "invalid_request_error", "invalid_value", "id");
  return editNode(
    c,
    (doc, index, id) => {
      const full = { ...given, id };
      if (index >= 0) doc.nodes[index] = full;
      else doc.nodes.push(full);
    },
    true,
  );
});

adminRoutes.delete("/nodes/:id", (c) => editNode(c, (doc, index) => doc.nodes.splice(index, 1)));

adminRoutes.post("/nodes/:id/drain", (c) =>
  editNode(c, (doc, index) => {
    doc.nodes[index]!.drain = true;
  }),
);

adminRoutes.post("/nodes/:id/undrain", (c) =>
  editNode(c, (doc, index) => {
    // drain defaults to false: dropping the field keeps the document minimal
    delete doc.nodes[index]!.drain;
  }),
);
