import { CONFIG_KEY, textVersion } from "./load";
import { withPlanLimits } from "./plan";
import { parseClusterDocument, type ConfigDefaults, type Problem } from "./schema";
import { nodesPointingAt } from "./self-origin";

// Admin writes of the cluster document (KV `NODES`, key `nodes`), as data the Durable Object
// can apply one at a time. A single-node edit is read-modify-write: two of them interleaved in
// the Worker would both read version N and the second write would silently drop the first edit
// (issue 11: 10 concurrent single-node PUTs, 2-3 survived). KV has no compare-and-swap, so the
// read-check-write runs inside the ClusterState Durable Object, serialised by DocumentEditor;
// `If-Match` (the ETag of GET /admin/nodes) is checked in the same critical section.

export type DocumentEdit =
  | { op: "replace"; raw: string }
  | { op: "put_node"; id: string; node: Record<string, unknown> }
  | { op: "delete_node"; id: string }
  | { op: "drain_node"; id: string; drain: boolean };

export interface DocumentEditRequest {
  edit: DocumentEdit;
  /** the If-Match header, as sent; absent = unconditional */
  ifMatch?: string | null;
  defaults: ConfigDefaults;
  /** the router's own origin: a node pointing at it would loop requests through the router */
  selfOrigin: string;
}

export type DocumentEditResult =
  | { ok: true; raw: string; version: string; nodes: string[] }
  | { ok: false; kind: "precondition_failed"; version: string | null }
  | { ok: false; kind: "invalid"; problems: Problem[] }
  | { ok: false; kind: "no_document" }
  | { ok: false; kind: "unusable_stored_document" }
  | { ok: false; kind: "node_not_found"; id: string };

/** The strong ETag of a stored document text. */
export const documentETag = (raw: string): string => `"${textVersion(raw)}"`;

/** Whether an If-Match header (RFC 9110: `*`, or a list of entity tags) matches the stored text. */
export function ifMatchSatisfied(header: string | null | undefined, raw: string | null): boolean {
  if (header === null || header === undefined) return true;
  if (raw === null) return false;
  const given = header.trim();
  if (given === "*") return true;
  const current = documentETag(raw);
  // Weak tags compare by their opaque part: our tags are strong, a W/ copy of one still names this text.
  return given.split(",").some((tag) => tag.trim().replace(/^W\//, "") === current);
}

export interface DocumentKv {
  get(key: string): Promise<string | null>;
  put(key: string, value: string): Promise<void>;
}

type Doc = Record<string, unknown> & { nodes: Array<Record<string, unknown>> };

function editableDocument(raw: string): Doc | null {
  let value: unknown;
  try {
    value = JSON.parse(raw);
  } catch {
    return null;
  }
  const doc = value as Doc | null;
  if (!doc || typeof doc !== "object" || Array.isArray(doc) || !Array.isArray(doc.nodes) || !doc.nodes.every((n) => n && typeof n === "object" && !Array.isArray(n))) return null;
  return doc;
}

/** Pure: the new document text an edit makes of the stored one, or why it cannot. */
export function applyEdit(stored: string | null, edit: DocumentEdit): { ok: true; raw: string } | Extract<DocumentEditResult, { ok: false }> {
  if (edit.op === "replace") return { ok: true, raw: edit.raw };
  if (stored === null && edit.op !== "put_node") return { ok: false, kind: "no_document" };
  const doc = stored === null ? ({ nodes: [] } as Doc) : editableDocument(stored);
  if (!doc) return { ok: false, kind: "unusable_stored_document" };
  const index = doc.nodes.findIndex((n) => n.id === edit.id);
  switch (edit.op) {
    case "put_node": {
      const full = { ...edit.node, id: edit.id };
      if (index >= 0) doc.nodes[index] = full;
      else doc.nodes.push(full);
      break;
    }
    case "delete_node":
      if (index < 0) return { ok: false, kind: "node_not_found", id: edit.id };
      doc.nodes.splice(index, 1);
      break;
    case "drain_node":
      if (index < 0) return { ok: false, kind: "node_not_found", id: edit.id };
      // drain defaults to false: dropping the field keeps the document minimal
      if (edit.drain) doc.nodes[index]!.drain = true;
      else delete doc.nodes[index]!.drain;
      break;
  }
  return { ok: true, raw: JSON.stringify(doc, null, 2) };
}

/** Validation of a document about to be written: the schema, plus no node at the router itself. */
export function writeProblems(raw: string, defaults: ConfigDefaults, selfOrigin: string): Problem[] {
  const parsed = parseClusterDocument(raw, withPlanLimits(defaults));
  if (!parsed.ok) return parsed.problems;
  return nodesPointingAt(parsed.config, selfOrigin).map((id) => ({
    path: `nodes[${parsed.config.nodes.findIndex((n) => n.id === id)}].url`,
    message: `is the router's own origin (${selfOrigin}): a routing loop`,
  }));
}

/**
 * Applies edits one at a time (a promise chain: within one Durable Object every call shares the
 * object's I/O context, so waiting on the previous edit is allowed there, unlike in the Worker).
 * KV reads may lag a write for up to a minute elsewhere, and "usually" not where it was written:
 * the editor also remembers what it wrote last, and when KV answers with a text this editor wrote
 * before that, it edits its own newer copy instead of losing the edits in between.
 */
/** KV: "changes may take up to 60 seconds or more to be visible in other global network locations" */
const KV_PROPAGATION_MS = 60_000;

export class DocumentEditor {
  #queue: Promise<unknown> = Promise.resolve();
  #lastWritten: string | null = null;
  #lastWrittenAt = -Infinity;
  readonly #written = new Set<string>();

  constructor(
    private readonly kv: () => DocumentKv,
    private readonly now: () => number = Date.now,
  ) {}

  run(req: DocumentEditRequest): Promise<DocumentEditResult> {
    const next = this.#queue.then(() => this.#apply(req));
    this.#queue = next.catch(() => undefined);
    return next;
  }

  async #apply(req: DocumentEditRequest): Promise<DocumentEditResult> {
    const kv = this.kv();
    let stored = await kv.get(CONFIG_KEY);
    // Only within KV's propagation window: later, an older text is an operator's deliberate revert.
    const lagging = this.now() - this.#lastWrittenAt < KV_PROPAGATION_MS;
    if (lagging && stored !== null && this.#lastWritten !== null && stored !== this.#lastWritten && this.#written.has(textVersion(stored))) stored = this.#lastWritten;
    if (!ifMatchSatisfied(req.ifMatch, stored)) return { ok: false, kind: "precondition_failed", version: stored === null ? null : textVersion(stored) };
    const edited = applyEdit(stored, req.edit);
    if (!edited.ok) return edited;
    const problems = writeProblems(edited.raw, req.defaults, req.selfOrigin);
    if (problems.length > 0) return { ok: false, kind: "invalid", problems };
    await kv.put(CONFIG_KEY, edited.raw);
    this.#lastWritten = edited.raw;
    this.#lastWrittenAt = this.now();
    this.#written.add(textVersion(edited.raw));
    if (this.#written.size > 1000) this.#written.delete(this.#written.values().next().value as string);
    const parsed = parseClusterDocument(edited.raw, withPlanLimits(req.defaults));
    return { ok: true, raw: edited.raw, version: textVersion(edited.raw), nodes: parsed.ok ? parsed.config.nodes.map((n) => n.id) : [] };
  }
}
