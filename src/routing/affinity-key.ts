import { sha256Hex } from "./hash";
import { chatMessages, completionPrompt, isRecord } from "./message-text";

export type AffinityKeySource = "previous_response" | "prompt_cache_key" | "session" | "agent_session" | "user" | "chat_prefix" | "prompt_prefix" | "prompt_blocks";
export type RequestKind = "chat" | "completion" | "responses";

export interface AffinityKeyInput {
  /** the `x-session-id` header, if any */
  sessionId?: string | null;
  /** the first documented agent session header present (AGENT_SESSION_HEADERS), if any */
  agentSessionId?: string | null;
  /**
   * the client's API key label (a short hash of its key; null without API_KEYS): a key the client
   * chose is hashed with it, so two tenants choosing the same key never share its node
   */
  tenant?: string | null;
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

/**
 * Session headers agent clients send on every request of one session, most specific first (SPEC 9:
 * after `prompt_cache_key` and `x-session-id`). Claude Code sends `x-claude-code-session-id` (a
 * UUID per session, since v2.1.86: ranxianglei/billion-context#92, griffinmartin/opencode-claude-auth#109);
 * the Codex CLI `session_id` (`session-id` / `thread-id` in later versions: KarpelesLab/teamclaude#352,
 * weave-os/router#1046, pleaseai/shunt#30); opencode `x-opencode-session`, or `x-session-affinity`
 * for custom providers (shunkakinoki/dotfiles#2824).
 */
export const AGENT_SESSION_HEADERS = ["x-claude-code-session-id", "session_id", "session-id", "x-opencode-session", "x-session-affinity"] as const;

/** The first agent session header present, trimmed (header names are case-insensitive: `get` reads them so). */
export function agentSessionOf(get: (name: string) => string | undefined | null): string | null {
  for (const name of AGENT_SESSION_HEADERS) {
    const value = get(name)?.trim();
    if (value) return value;
  }
  return null;
}

/** Characters of a string prompt and token ids of a token prompt that make a completions key. */
export const PROMPT_PREFIX_CHARS = 512;
export const PROMPT_PREFIX_TOKENS = 64;

const CHAT_SYSTEM_ROLES = new Set(["system", "developer"]);

/**
 * What a request's affinity key is made of, first that applies (SPEC 5, 9): the body's
 * `prompt_cache_key` (OpenAI's own key for routing to a cache, Chat Completions and Responses), the
 * `x-session-id` header, an agent session header — each of those three chosen by the client, so
 * hashed with its API key's label — then the body's `user`; for chat, the system/developer messages before the first user message plus that
 * user message (so a shared system prompt alone does not decide, and appended turns keep the key);
 * for completions, the first 512 characters of the prompt or its first 64 token ids.
 * null when none applies (the caller falls back to round robin).
 */
export function affinityKeyMaterial(input: AffinityKeyInput): AffinityKeyMaterial | null {
  // A Responses API turn that continues a stored response must reach the nodes that served it
  // (the response store is the engine's); the router remembers them under this key.
  const previous = isRecord(input.body) ? input.body.previous_response_id : undefined;
  if (input.kind === "responses" && typeof previous === "string" && previous) return responseKeyMaterial(previous);
  const body = input.body;
  const cacheKey = isRecord(body) && input.kind !== "completion" ? body.prompt_cache_key : undefined;
  if (typeof cacheKey === "string" && cacheKey.length > 0) return tenantKeyed("prompt_cache_key", cacheKey, input.tenant);
  const session = input.sessionId?.trim();
  if (session) return tenantKeyed("session", session, input.tenant);
  const agent = input.agentSessionId?.trim();
  if (agent) return tenantKeyed("agent_session", agent, input.tenant);
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

/** A client-chosen key under its tenant: the same value from two API keys is two keys (no tenant: the value alone). */
function tenantKeyed(source: AffinityKeySource, value: string, tenant: string | null | undefined): AffinityKeyMaterial {
  return tenant ? { source, material: `${source}\u0000${tenant}\u0000${value}` } : keyed(source, value);
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
