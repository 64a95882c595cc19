// The text of a chat message's content, canonicalised so that `"hi"` and
// `[{"type":"text","text":"hi"}]` are the same: both the affinity key and the prefix blocks
// must not depend on which of the two shapes a client used.

/** Joins text parts with "\n" (as vLLM's chat templates do); non-text parts are ignored. */
export function contentText(content: unknown): string {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  const texts: string[] = [];
  for (const part of content) {
    if (typeof part === "string") texts.push(part);
    else if (isRecord(part) && typeof part.text === "string" && (part.type === undefined || part.type === "text")) {
      texts.push(part.text);
    }
  }
  return texts.join("\n");
}

export interface ChatMessageView {
  role: string;
  text: string;
}

/** The body's `messages` as (role, text) pairs; entries that are not messages are dropped. */
export function chatMessages(body: unknown): ChatMessageView[] {
  if (isRecord(body) && !Array.isArray(body.messages) && "input" in body) return responsesMessages(body);
  if (!isRecord(body) || !Array.isArray(body.messages)) return [];
  const out: ChatMessageView[] = [];
  for (const message of body.messages) {
    if (!isRecord(message) || typeof message.role !== "string") continue;
    out.push({ role: message.role, text: contentText(message.content) });
  }
  return out;
}

export function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/**
 * A completions body's prompt: a string or a list of token ids; for a batch (array of strings or
 * of token arrays) the first prompt stands for the request. null when there is none.
 */
export function completionPrompt(body: unknown): string | number[] | null {
  if (!isRecord(body)) return null;
  let prompt = body.prompt;
  if (Array.isArray(prompt) && prompt.length > 0 && (typeof prompt[0] === "string" || Array.isArray(prompt[0]))) {
    prompt = prompt[0];
  }
  if (typeof prompt === "string") return prompt;
  if (Array.isArray(prompt) && prompt.every((t): t is number => typeof t === "number")) return prompt;
  return null;
}

/**
 * A Responses API body as chat messages: `instructions` is the system message, `input` a user
 * message (a string) or a list of message items (`{role, content}` with `input_text` parts).
 */
export function responsesMessages(body: Record<string, unknown>): ChatMessageView[] {
  const out: ChatMessageView[] = [];
  if (typeof body.instructions === "string" && body.instructions) out.push({ role: "system", text: body.instructions });
  const input = body.input;
  if (typeof input === "string") out.push({ role: "user", text: input });
  else if (Array.isArray(input)) {
    for (const item of input) {
      if (!isRecord(item) || typeof item.role !== "string") continue;
      const content = Array.isArray(item.content) ? item.content.map((p) => (isRecord(p) && typeof p.text === "string" ? p.text : "")).join("\n") : contentText(item.content);
      out.push({ role: item.role, text: content });
    }
  }
  return out;
}
