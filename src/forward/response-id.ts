import { responseKeyMaterial } from "../routing/affinity-key";
import { sha256Hex } from "../routing/hash";
import type { RequestLife } from "./lifecycle";

const RESPONSE_ID = /"id"\s*:\s*"(resp[^"]{1,200})"/;

/** A Responses API answer's id: the key under which its nodes are remembered for `previous_response_id`. */
export function rememberResponse(life: RequestLife, text: string): void {
  const id = RESPONSE_ID.exec(text)?.[1];
  if (id) life.rememberAs(sha256Hex(responseKeyMaterial(id).material));
}

/** Reads a Responses stream's opening bytes (response.created) for its id, however D's chunks split them. */
export function responseIdWatcher(life: RequestLife): (bytes: Uint8Array) => void {
  const decoder = new TextDecoder();
  let seen: string | null = "";
  return (bytes) => {
    if (seen === null) return;
    seen += decoder.decode(bytes, { stream: true });
    if (RESPONSE_ID.test(seen) || seen.length > 65536) {
      rememberResponse(life, seen);
      seen = null;
    }
  };
}
