import { editMembers } from "./json-text";

// The client's bytes go to the nodes unchanged except for the members a protocol must set or
// drop: those are edited in the raw JSON text (json-text.ts), so numbers beyond 2^53 (seeds,
// the sglang room) survive exactly on every leg.

/** Fields a client may not set itself: they steer KV transfers between nodes. */
export const ROUTER_OWNED_FIELDS = ["kv_transfer_params", "bootstrap_host", "bootstrap_port", "bootstrap_room"] as const;

/** The client's body with router-owned fields removed, `set` (raw JSON values) added and `drop` removed. */
export function withFields(raw: string, set: Record<string, string>, drop: readonly string[] = []): string {
  return editMembers(raw, set, [...ROUTER_OWNED_FIELDS, ...drop]);
}
