import { toHex } from "./hash";
import { chatMessages, completionPrompt } from "./message-text";
import type { RequestKind } from "./affinity-key";

const encoder = new TextEncoder();

/** Hex characters kept of each block hash: 64 bits, plenty for an index of ~10^6 blocks. */
export const BLOCK_HASH_HEX = 16;

/**
 * Chained hashes of the full `blockChars`-character blocks of `text` (a trailing partial block is
 * not hashed: engines cache only full blocks): hash_i = sha256(hash_{i-1} + block_i) cut to 16 hex
 * characters, hash_{-1} = "". Equal hash_i means equal text up to the end of block i, which is what
 * a prefix cache holds. At most `maxBlocks` blocks.
 */
export async function prefixBlockHashes(text: string, blockChars: number, maxBlocks = Infinity): Promise<string[]> {
  if (!(blockChars >= 1)) return [];
  const size = Math.floor(blockChars);
  const count = Math.min(Math.floor(text.length / size), maxBlocks);
  const hashes: string[] = [];
  let previous = "";
  for (let i = 0; i < count; i++) {
    const block = text.slice(i * size, (i + 1) * size);
    const digest = await crypto.subtle.digest("SHA-256", encoder.encode(previous + block));
    previous = toHex(digest, BLOCK_HASH_HEX / 2);
    hashes.push(previous);
  }
  return hashes;
}

/**
 * The request's prompt as one string for prefix blocks. Chat: `<|role|>\ncontent\n` per message,
 * content canonicalised as in the affinity key (string and text parts alike, other parts dropped),
 * so a later turn of a conversation extends the earlier turn's text. Completions: the prompt as
 * is, a token prompt as its ids joined with commas; for a batch, the first prompt.
 */
export function canonicalPromptText(body: unknown, kind: RequestKind): string {
  if (kind !== "completion") {
    let out = "";
    for (const message of chatMessages(body)) out += `<|${message.role}|>\n${message.text}\n`;
    return out;
  }
  const prompt = completionPrompt(body);
  if (prompt === null) return "";
  return typeof prompt === "string" ? prompt : prompt.join(",");
}

/**
 * The prompt's size for the policies that need no prefix blocks (conditional disaggregation and
 * balancing in tokens still weigh requests by it). Built, not counted apart: the body is parsed
 * already, and V8 joins `+=` strings as ropes whose length needs no copy.
 */
export function promptCharCount(body: unknown, kind: RequestKind): number {
  return canonicalPromptText(body, kind).length;
}
