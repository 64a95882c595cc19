// The client's bytes go to the nodes unchanged except for the fields a protocol must add:
// those are spliced into the raw JSON text, so numbers beyond 2^53 (seeds, the sglang room)
// survive exactly.

/** Fields a client may not set itself: they steer KV transfers between nodes. */
export const ROUTER_OWNED_FIELDS = ["kv_transfer_params", "bootstrap_host", "bootstrap_port", "bootstrap_room"] as const;

/**
 * Returns the body with `extra` appended; each value is raw JSON text. Router-owned fields
 * the client sent are dropped (then the body is re-serialised from the parsed value).
 */
export function withFields(raw: string, parsed: Record<string, unknown>, extra: Record<string, string>): string {
  const clean = ROUTER_OWNED_FIELDS.some((f) => f in parsed)
    ? JSON.stringify(Object.fromEntries(Object.entries(parsed).filter(([k]) => !(ROUTER_OWNED_FIELDS as readonly string[]).includes(k))))
    : raw.trimEnd();
  const additions = Object.entries(extra)
    .map(([k, v]) => `${JSON.stringify(k)}:${v}`)
    .join(",");
  if (!additions) return clean;
  const end = clean.lastIndexOf("}");
  const inner = clean.slice(0, end).trimEnd();
  const empty = inner.endsWith("{");
  return `${inner}${empty ? "" : ","}${additions}}`;
}
