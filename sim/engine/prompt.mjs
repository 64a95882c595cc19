// What a simulated answer says about its prompt: the prompt of a request body (text or token
// ids, every prompt of a batch), and the digest each answer starts with, so a test can tell an
// answer computed on another prompt's KV from the right one. Shared by every route of the engine.
import { createHash } from 'node:crypto';

/** the words every simulated answer after its first is made of */
export const FILLER = 'the quick brown fox jumps over a lazy dog while seven bright stars drift across calm northern water'.split(' ');

/**
 * The first word of every answer the simulator generates for a prompt: `p` + 8 hex digits of its
 * SHA-256. A decode leg that read another prompt's KV starts with that prompt's digest instead.
 * @param {string | number[]} prompt
 */
export function promptDigest(prompt) {
  return (
    'p' +
    createHash('sha256')
      .update(typeof prompt === 'string' ? prompt : JSON.stringify(prompt))
      .digest('hex')
      .slice(0, 8)
  );
}

/**
 * What a correct answer to this body starts with (each choice's text, or a chat message's
 * content): `expectedPrefix(body).startsWith`-style checks tell an answer that belongs to this
 * prompt from one computed on another prompt's KV. For a batched /v1/completions, the digest of
 * prompt `index`.
 * @param {any} body request body (chat when it has `messages`) @param {number} [index]
 */
export function expectedPrefix(body, index = 0) {
  const prompts = promptsOf(body, Array.isArray(body?.messages));
  if (!prompts[index]) throw new TypeError('body has no prompt');
  return promptDigest(prompts[index]);
}

/**
 * Every prompt of a body: one for chat or a single prompt, N for a batched /v1/completions
 * (a list of strings or a list of token-id lists).
 * @param {any} body @param {boolean} chat @returns {(string | number[])[]}
 */
export function promptsOf(body, chat) {
  const p = body?.prompt;
  if (!chat && Array.isArray(p) && p.length > 1 && (typeof p[0] === 'string' || Array.isArray(p[0]))) return p;
  const one = promptOf(body, chat);
  return one === undefined ? [] : [one];
}

/**
 * The prompt as text (chat messages rendered `role: content`, one a line) or token ids.
 * @param {any} body @param {boolean} chat
 * @returns {string | number[] | undefined}
 */
export function promptOf(body, chat) {
  if (chat) {
    if (!Array.isArray(body.messages) || body.messages.length === 0) return undefined;
    return body.messages
      .map((/** @type {any} */ m) => {
        const content = Array.isArray(m?.content)
          ? m.content.map((/** @type {any} */ part) => (part && part.type === 'text' ? String(part.text ?? '') : '')).join('')
          : typeof m?.content === 'string'
            ? m.content
            : '';
        return `${m?.role ?? 'user'}: ${content}`;
      })
      .join('\n');
  }
  const p = body.prompt;
  if (typeof p === 'string') return p;
  if (Array.isArray(p) && p.length > 0) {
    if (p.every((x) => typeof x === 'number')) return p;
    if (typeof p[0] === 'string') return p[0];
    if (Array.isArray(p[0]) && p[0].every((/** @type {unknown} */ x) => typeof x === 'number')) return p[0];
  }
  return undefined;
}
