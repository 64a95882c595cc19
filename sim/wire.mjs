// What every simulated endpoint shares: reading a body, answering JSON and errors, SSE headers, an
// answer broken on purpose (writeThenBreak), and the rendezvous by which a D leg waits for its P
// (an SGLang bootstrap room, a Mooncake transfer id).
import { setTimeout as sleepReal } from 'node:timers/promises';

/** @param {import('node:http').IncomingMessage} req @returns {Promise<string>} */
export function readBody(req) {
  return new Promise((resolve, reject) => {
    /** @type {Buffer[]} */
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    req.on('error', reject);
  });
}

/** @param {import('node:http').IncomingHttpHeaders} headers @returns {Record<string, string>} */
export function lowerHeaders(headers) {
  /** @type {Record<string, string>} */
  const out = {};
  for (const [k, v] of Object.entries(headers)) {
    if (v !== undefined) out[k.toLowerCase()] = Array.isArray(v) ? v.join(', ') : v;
  }
  return out;
}

/** @param {import('node:http').ServerResponse} res @param {number} status @param {unknown} body */
export function sendJson(res, status, body) {
  if (res.headersSent || res.destroyed) return;
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

/**
 * OpenAI error envelope (vLLM's ErrorResponse carries the same fields).
 * @param {import('node:http').ServerResponse} res @param {number} status @param {string} message @param {string} type
 * @param {string | null} [code] @param {string | null} [param]
 */
export function sendError(res, status, message, type, code = null, param = null) {
  sendJson(res, status, { error: { message, type, param, code } });
}

/** @param {string} a @param {string} b */
export function sameHost(a, b) {
  const norm = (/** @type {string} */ h) => (h === 'localhost' || h === '::1' || h === '[::1]' ? '127.0.0.1' : h);
  return norm(a) === norm(b);
}

/** @param {unknown} v */
export function positiveInt(v) {
  return typeof v === 'number' && Number.isInteger(v) && v > 0 ? v : undefined;
}

/**
 * Publishes what a P leg made under `key` and wakes the D legs waiting for it.
 * @template E @param {Map<string, E>} entries @param {Map<string, Set<(entry: E) => void>>} waiters
 * @param {string} key @param {E} entry @param {number} cap entries kept, oldest dropped first
 */
export function publish(entries, waiters, key, entry, cap) {
  entries.set(key, entry);
  if (entries.size > cap) entries.delete(/** @type {string} */ (entries.keys().next().value));
  const waiting = waiters.get(key);
  if (waiting) {
    waiters.delete(key);
    for (const wake of waiting) wake(entry);
  }
}

/**
 * Waits until `key` is published, the timeout passes or the client leaves (undefined then).
 * @template E @param {Map<string, E>} entries @param {Map<string, Set<(entry: E | undefined) => void>>} waiters
 * @param {string} key @param {number} timeoutMs @param {{ closed: boolean }} ctx
 * @returns {Promise<E | undefined>}
 */
export function waitFor(entries, waiters, key, timeoutMs, ctx) {
  const ready = entries.get(key);
  if (ready) return Promise.resolve(ready);
  return new Promise((resolve) => {
    let set = waiters.get(key);
    if (!set) waiters.set(key, (set = new Set()));
    const mine = set;
    const finish = (/** @type {E | undefined} */ entry) => {
      clearTimeout(timer);
      clearInterval(poll);
      mine.delete(finish);
      if (mine.size === 0 && waiters.get(key) === mine) waiters.delete(key);
      resolve(entry);
    };
    const timer = setTimeout(() => finish(undefined), timeoutMs);
    // a client that leaves stops the wait (checked cheaply, no listener juggling)
    const poll = setInterval(() => ctx.closed && finish(undefined), 50);
    mine.add(finish);
  });
}

/** Resolves when a response can take more, or closed. @param {import('node:http').ServerResponse} res */
export function drained(res) {
  return new Promise((resolve) => {
    const done = () => {
      res.off('drain', done);
      res.off('close', done);
      resolve(undefined);
    };
    res.on('drain', done);
    res.on('close', done);
  });
}

/** Send SSE response headers unless they went out already. @param {import('node:http').ServerResponse} res */
export function sseHeaders(res) {
  if (res.headersSent) return;
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', connection: 'keep-alive' });
  res.flushHeaders();
}

/**
 * Write `data`, let it reach the client, then break the connection (the `midstream` fault): the
 * client sees an answer that breaks, not none.
 * @param {import('node:http').ServerResponse} res @param {{ destroyedByUs: boolean }} ctx @param {string} data
 */
export async function writeThenBreak(res, ctx, data) {
  await new Promise((resolve) => res.write(data, () => resolve(undefined)));
  await sleepReal(10);
  ctx.destroyedByUs = true;
  res.socket?.destroy();
}
