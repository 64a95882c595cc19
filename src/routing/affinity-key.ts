import { sha256Hex } from "./hash";
import { chatMessages, completionPrompt, isRecord } from "./message-text";

export type AffinityKeySource = "previous_response" | "session" | "user" | "chat_prefix" | "prompt_prefix" | "prompt_blocks";
export type RequestKind = "chat" | "completion" | "responses";

export interface AffinityKeyInput {
  /** the `x-session-id` header, if any */
  sessionId?: string | null;
  /** the parsed JSON body */
  body: unknown;
  kind: RequestKind;
}

export interface AffinityKeyMaterial {
  source: AffinityKeySource;
  /** `source` + NUL + what identifies the conversation (never leaves the Worker) */
  material: string;
}

export interface AffinityKey {
  source: AffinityKeySource;
  /** hex SHA-256 of the material */
  hash: string;
}

/** Characters of a string prompt and token ids of a token prompt that make a completions key. */
export const PROMPT_PREFIX_CHARS = 512;
export const PROMPT_PREFIX_TOKENS = 64;

const CHAT_SYSTEM_ROLES = new Set(["system", "developer"]);

/**
 * What a request's affinity key is made of, first that applies (SPEC 5): the session header; the
 * body's `user`; for chat, the system/developer messages before the first user message plus that
 * user message (so a shared system prompt alone does not decide, and appended turns keep the key);
 * for completions, the first 512 characters of the prompt or its first 64 token ids.
 * null when none applies (the caller falls back to round robin).
 */
export function affinityKeyMaterial(input: AffinityKeyInput): AffinityKeyMaterial | null {
  // A Responses API turn that continues a stored response must reach the nodes that served it
  // (the response store is the engine's); the router remembers them under this key.
  const previous = isRecord(input.body) ? input.body.previous_response_id : undefined;
  if (input.kind === "responses" && typeof previous === "string" && previous) return responseKeyMaterial(previous);
  const session = input.sessionId?.trim();
  if (session) return keyed("session", session);
  const body = input.body;
  if (isRecord(body) && typeof body.user === "string" && body.user.length > 0) {
    return keyed("user", body.user);
  }
  return input.kind === "completion" ? promptPrefix(body) : chatPrefix(body);
}

/** The key under which a stored response's nodes are remembered, and a follow-up finds them. */
export function responseKeyMaterial(responseId: string): AffinityKeyMaterial {
  return keyed("previous_response", responseId);
}

/** The affinity key of a request, hashed (the material itself may be sensitive). */
export async function affinityKey(input: AffinityKeyInput): Promise<AffinityKey | null> {
  const found = affinityKeyMaterial(input);
  if (!found) return null;
  return { source: found.source, hash: await sha256Hex(found.material) };
}

function keyed(source: AffinityKeySource, value: string): AffinityKeyMaterial {
  return { source, material: `${source}\u0000${value}` };
}

function chatPrefix(body: unknown): AffinityKeyMaterial | null {
  const parts: Array<[string, string]> = [];
  for (const message of chatMessages(body)) {
    if (message.role === "user") {
      // A first user message without text (e.g. only an image) would leave the system prompt
      // deciding alone, which sends every such conversation to one node: no key instead.
      if (message.text.length === 0) return null;
      parts.push(["user", message.text]);
      return keyed("chat_prefix", JSON.stringify(parts));
    }
    if (CHAT_SYSTEM_ROLES.has(message.role)) parts.push([message.role, message.text]);
  }
  return null;
}

function promptPrefix(body: unknown): AffinityKeyMaterial | null {
  const prompt = completionPrompt(body);
  if (prompt === null || prompt.length === 0) return null;
  if (typeof prompt === "string") return keyed("prompt_prefix", prompt.slice(0, PROMPT_PREFIX_CHARS));
  return keyed("prompt_prefix", `tokens:${prompt.slice(0, PROMPT_PREFIX_TOKENS).join(",")}`);
}

/** How many leading prefix blocks make a completions conversation's key under cache_aware. */
export const CONVERSATION_KEY_BLOCKS = 4;

/**
 * cache_aware keys a completions prompt deeper than its first 512 characters: those are often
 * a system prompt every request shares, and a key that every request has would make the
 * session-stickiness and tie-break pile all new conversations onto one node. The chained hash
 * of the first few blocks covers them and what follows, and stays the same across turns.
 */
export function conversationKey(key: AffinityKey | null, prefixHashes: readonly string[]): AffinityKey | null {
  if (key?.source !== "prompt_prefix" || prefixHashes.length === 0) return key;
  return { source: "prompt_blocks", hash: prefixHashes[Math.min(prefixHashes.length, CONVERSATION_KEY_BLOCKS) - 1]! };
}
