// The Chrome DevTools protocol over one websocket, for workerd's V8 inspector (--inspector-port):
// CPU profiles (bench/profile.mjs) and heap figures after a forced GC (test/node/lifecycle-memory.test.ts).
import { WebSocket } from 'undici';

/**
 * Opens a session on the inspector target whose title contains `title` (the first target without it).
 * @param {number} port
 * @param {string} [title]
 * @returns {Promise<{ target: { webSocketDebuggerUrl: string, title?: string, id: string }, send: (method: string, params?: object) => Promise<any>, close: () => void }>}
 */
export async function devtoolsSession(port, title) {
  const targets = /** @type {{ webSocketDebuggerUrl: string, title?: string, id: string }[]} */ (await (await fetch(`http://127.0.0.1:${port}/json/list`)).json());
  const target = (title && targets.find((t) => t.title?.includes(title))) || targets[0];
  if (!target) throw new Error('workerd lists no inspector target');
  return { target, ...(await devtools(target.webSocketDebuggerUrl.replace('localhost', '127.0.0.1'))) };
}

/** The DevTools protocol over one websocket: send(method, params) -> result. @param {string} url */
export async function devtools(url) {
  const ws = new WebSocket(url);
  await new Promise((resolve, reject) => {
    ws.addEventListener('open', resolve, { once: true });
    ws.addEventListener('error', () => reject(new Error(`cannot open ${url}`)), { once: true });
  });
  let id = 0;
  /** @type {Map<number, { resolve: (v: any) => void, reject: (e: Error) => void }>} */
  const waiting = new Map();
  /** @type {Map<string, (params: any) => void>} */
  const listeners = new Map();
  ws.addEventListener('message', (event) => {
    const msg = JSON.parse(String(event.data));
    if (msg.method) listeners.get(msg.method)?.(msg.params);
    const w = msg.id !== undefined ? waiting.get(msg.id) : undefined;
    if (!w) return;
    waiting.delete(msg.id);
    if (msg.error) w.reject(new Error(`${msg.error.message} (${msg.error.code})`));
    else w.resolve(msg.result);
  });
  return {
    /** @param {string} method @param {object} [params] @returns {Promise<any>} */
    send(method, params = {}) {
      const msgId = ++id;
      ws.send(JSON.stringify({ id: msgId, method, params }));
      return new Promise((resolve, reject) => waiting.set(msgId, { resolve, reject }));
    },
    /** @param {string} method @param {(params: any) => void} listener */
    on(method, listener) {
      listeners.set(method, listener);
    },
    close: () => ws.close(),
  };
}

/**
 * The isolate's heap in use after full collections (bytes): what the isolate keeps, not what it
 * has yet to collect, nor what the inspector itself holds. Collected until two readings agree within 1 KiB (finalizers free more).
 * @param {{ send: (method: string, params?: object) => Promise<any> }} session
 */
export async function heapAfterGc(session) {
  // the inspector keeps the last 1,000 console messages for a console to come (V8's
  // ConsoleMessageStorage): the router's log lines, one a request, are not the isolate's
  await session.send('Runtime.discardConsoleEntries');
  let last = Number.POSITIVE_INFINITY;
  for (let i = 0; i < 8; i++) {
    await session.send('HeapProfiler.collectGarbage');
    const { usedSize } = await session.send('Runtime.getHeapUsage');
    if (Math.abs(last - usedSize) < 1024) return usedSize;
    last = usedSize;
  }
  return last;
}

/**
 * A heap snapshot (the .heapsnapshot JSON text), to see what a leak keeps.
 * @param {{ send: (method: string, params?: object) => Promise<any>, on: (method: string, listener: (params: any) => void) => void }} session
 */
export async function heapSnapshot(session) {
  /** @type {string[]} */
  const chunks = [];
  session.on('HeapProfiler.addHeapSnapshotChunk', (p) => chunks.push(p.chunk));
  await session.send('HeapProfiler.takeHeapSnapshot', { reportProgress: false });
  return chunks.join('');
}

/**
 * Bytes of the JS objects a heap snapshot holds, compiled code left out: what a leak keeps,
 * without the JIT's work, which grows with every new path a run takes (heapAfterGc counts both).
 * A snapshot is taken after a full collection.
 * @param {{ send: (method: string, params?: object) => Promise<any>, on: (method: string, listener: (params: any) => void) => void }} session
 * @returns {Promise<{ bytes: number, byType: Record<string, number> }>}
 */
export async function heapObjectBytes(session) {
  await session.send('Runtime.discardConsoleEntries');
  const snapshot = JSON.parse(await heapSnapshot(session));
  const fields = snapshot.snapshot.meta.node_fields;
  const types = snapshot.snapshot.meta.node_types[0];
  const typeAt = fields.indexOf('type');
  const sizeAt = fields.indexOf('self_size');
  /** @type {Record<string, number>} */
  const byType = {};
  let bytes = 0;
  for (let i = 0; i < snapshot.nodes.length; i += fields.length) {
    const type = types[snapshot.nodes[i + typeAt]];
    if (type === 'code') continue;
    const size = snapshot.nodes[i + sizeAt];
    byType[type] = (byType[type] ?? 0) + size;
    bytes += size;
  }
  return { bytes, byType };
}
