// The benchmark's HTTP client: keep-alive node:http (lighter than fetch, so the client adds
// little to what is measured), with time to first body byte and SSE parsing for streams.
import http from 'node:http';
import { createParser } from 'eventsource-parser';

/**
 * @typedef {object} PostResult
 * @property {number} status
 * @property {Record<string, string | string[] | undefined>} headers
 * @property {number} ttfbMs time from sending to the first byte of the body (a stream's first event)
 * @property {number} totalMs
 * @property {any} [json] non-stream answers
 * @property {string} [text] streams: the content deltas joined
 * @property {any} [usage] streams: the usage chunk, when asked for
 * @property {number} [events] streams: data events received
 * @property {string} [error] transport or SSE error
 * @property {number} [retries] attempts repeated because of `wrangler dev`'s own proxy (see postJsonRetrying)
 */

/** @param {number} maxSockets */
export function createAgent(maxSockets) {
  return new http.Agent({ keepAlive: true, maxSockets, maxFreeSockets: maxSockets });
}

/**
 * POST a JSON body; parse the answer as SSE when it is `text/event-stream`, else as JSON.
 * @param {string} url
 * @param {unknown} body object (JSON-encoded here) or a ready string
 * @param {{ agent?: http.Agent, headers?: Record<string, string>, timeoutMs?: number, signal?: AbortSignal, onFirstByte?: () => void, abandonAfterSentMs?: number }} [options]
 *   abandonAfterSentMs: the client leaves that long after its request is fully sent (so the server has it)
 * @returns {Promise<PostResult>}
 */
export function postJson(url, body, { agent, headers = {}, timeoutMs = 600000, signal, onFirstByte, abandonAfterSentMs } = {}) {
  const payload = typeof body === 'string' ? body : JSON.stringify(body);
  const started = performance.now();
  return new Promise((resolve) => {
    const req = http.request(url, {
      method: 'POST',
      agent,
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload), ...headers },
      timeout: timeoutMs,
      signal,
    });
    let settled = false;
    const finish = (/** @type {PostResult} */ result) => {
      if (settled) return;
      settled = true;
      resolve(result);
    };
    req.on('timeout', () => req.destroy(new Error(`timed out after ${timeoutMs} ms`)));
    if (abandonAfterSentMs !== undefined) req.on('finish', () => setTimeout(() => req.destroy(new Error('client left')), abandonAfterSentMs));
    req.on('error', (error) => finish({ status: 0, headers: {}, ttfbMs: NaN, totalMs: performance.now() - started, error: error.message }));
    req.on('response', (res) => {
      let ttfbMs = NaN;
      const stream = String(res.headers['content-type'] ?? '').includes('text/event-stream');
      /** @type {Buffer[]} */
      const chunks = [];
      let text = '';
      let events = 0;
      /** @type {any} */
      let usage;
      /** @type {string | undefined} */
      let error;
      const parser = createParser({
        onEvent(event) {
          if (event.data === '[DONE]') return;
          events++;
          try {
            const chunk = JSON.parse(event.data);
            if (chunk.error) error = chunk.error.message ?? 'stream error';
            if (chunk.usage) usage = chunk.usage;
            const choice = chunk.choices?.[0];
            if (choice) text += choice.delta?.content ?? choice.text ?? '';
          } catch {
            error = `bad SSE data: ${event.data.slice(0, 80)}`;
          }
        },
      });
      res.on('data', (/** @type {Buffer} */ data) => {
        if (Number.isNaN(ttfbMs)) {
          ttfbMs = performance.now() - started;
          onFirstByte?.();
        }
        if (stream) parser.feed(data.toString('utf8'));
        else chunks.push(data);
      });
      res.on('error', (e) => (error = e.message));
      res.on('close', () => {
        const base = { status: res.statusCode ?? 0, headers: res.headers, ttfbMs, totalMs: performance.now() - started };
        if (!res.complete && !error) error = 'response ended early';
        if (stream) return finish({ ...base, text, usage, events, error });
        const raw = Buffer.concat(chunks).toString('utf8');
        /** @type {any} */
        let json;
        try {
          json = raw ? JSON.parse(raw) : undefined;
        } catch {
          error ??= `non-JSON answer: ${raw.slice(0, 120)}`;
        }
        finish({ ...base, json, error });
      });
    });
    req.end(payload);
  });
}

/**
 * A 503 that `wrangler dev`'s proxy answers by itself ("Your worker restarted mid-request"),
 * though the Worker never restarted and never saw the request: a keep-alive race between the
 * proxy and workerd (cloudflare/workers-sdk#14641), or a client socket the dev server closed
 * while idle. Neither exists in production, and the request reached no engine, so it is safe
 * to repeat; the count is reported.
 * @param {PostResult} r
 */
export function isDevProxyGlitch(r) {
  if (r.status === 503 && typeof r.error === 'string' && r.error.includes('restarted mid-request')) return true;
  return r.status === 0 && /ECONNRESET|socket hang up/.test(r.error ?? '');
}

/**
 * postJson, repeated (up to 3 more times) only on a dev-proxy glitch.
 * @param {Parameters<typeof postJson>} args
 * @returns {Promise<PostResult>}
 */
export async function postJsonRetrying(...args) {
  let retries = 0;
  for (;;) {
    const r = await postJson(...args);
    if (!isDevProxyGlitch(r) || retries >= 3) return { ...r, retries };
    retries++;
  }
}

/**
 * Run `task(i)` for i in [0, count) with at most `concurrency` at once.
 * @template T
 * @param {number} count @param {number} concurrency @param {(i: number) => Promise<T>} task
 * @returns {Promise<T[]>}
 */
export async function runPool(count, concurrency, task) {
  /** @type {T[]} */
  const results = new Array(count);
  let next = 0;
  const worker = async () => {
    while (next < count) {
      const i = next++;
      results[i] = await task(i);
    }
  };
  await Promise.all(Array.from({ length: Math.min(concurrency, count) }, worker));
  return results;
}
