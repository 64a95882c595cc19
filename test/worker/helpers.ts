import { env, listDurableObjectIds, reset, runInDurableObject, SELF } from "cloudflare:test";
import { inject } from "vitest";
import { forgetBlockedForTests } from "../../src/auth/client-access";
import { forgetConfigForTests } from "../../src/config/runtime";
import { parseClusterDocument } from "../../src/config/schema";
import { forgetEngineIdsForTests } from "../../src/forward/vllm-mooncake";

export interface FileEngines {
  id: string;
  controlUrl: string;
  engines: Record<string, string>;
}

// Module state of one test file. The Worker projects run without isolation (vitest.config.ts):
// this module is evaluated once per pool worker and shared by the files it runs one after the
// other, so file-engines.ts (a setup file, evaluated again for every file) resets it with
// beginFile() before the file's own module runs.
let fileEngines: FileEngines | null = null;
let wantsEngines = true;

/** A test file starts: no engines yet, and it wants them unless it says otherwise (withoutFileEngines). */
export function beginFile(): void {
  fileEngines = null;
  wantsEngines = true;
}

/**
 * Called at the top of a test file of pure code: no engines are started for it (file-engines.ts).
 * Twelve servers it never reaches cost a busy machine CPU, and the DELETE that stops them after
 * its last test is one more request that can fail with the file's tests all passed.
 */
export function withoutFileEngines(): void {
  wantsEngines = false;
}

/** This test file's simulated engines (started by file-engines.ts before its first test). */
export const sim = (): FileEngines => {
  if (!fileEngines) throw new Error("no engines: sim() ran before the file's beforeAll (test/worker/file-engines.ts), or in a file that called withoutFileEngines()");
  return fileEngines;
};

export async function startFileEngines(): Promise<void> {
  if (fileEngines) throw new Error("startFileEngines: the previous file's engines were never stopped");
  if (!wantsEngines) return;
  const res = await fetch(`${inject("simFactory")}/clusters`, { method: "POST" });
  if (!res.ok) throw new Error(`could not start this file's engines: ${res.status} ${await res.text()}`);
  fileEngines = await res.json();
}

export async function stopFileEngines(): Promise<void> {
  wantsEngines = true;
  if (!fileEngines) return;
  const { id } = fileEngines;
  fileEngines = null;
  // A DELETE is idempotent (an unknown id answers ok), and the run's teardown closes every cluster
  // anyway: a connection lost on a busy machine is tried once more, not a failed file.
  for (let attempt = 1; ; attempt++) {
    try {
      await (await fetch(`${inject("simFactory")}/clusters/${id}`, { method: "DELETE" })).arrayBuffer();
      return;
    } catch (err) {
      if (attempt === 2) throw err;
    }
  }
}

export const engineUrl = (id: string) => {
  const url = sim().engines[id];
  if (!url) throw new Error(`no engine ${id}`);
  return url;
};

export type NodeSpec = {
  id: string;
  role: "prefill" | "decode" | "both";
  group?: string;
  weight?: number;
  drain?: boolean;
  models?: string[];
  apiKeySecret?: string;
  url?: string;
  vllmVersion?: string;
};

/**
 * Writes the cluster document to KV; the tests run with CONFIG_TTL_MS=0 so it applies at once.
 * It must be valid: an invalid one would leave the previous test's document serving, and the test
 * would pass or fail by the order tests run in (putRawCluster writes invalid ones on purpose).
 */
export async function putCluster(doc: Record<string, unknown> & { nodes: NodeSpec[] }) {
  const nodes = doc.nodes.map((n) => ({ url: engineUrl(n.id), ...n }));
  const text = JSON.stringify({ ...doc, nodes });
  const parsed = parseClusterDocument(text);
  if (!parsed.ok) throw new Error(`putCluster: invalid cluster document: ${parsed.problems.map((p) => `${p.path}: ${p.message}`).join("; ")}`);
  await env.NODES.put("nodes", text);
}

export async function putRawCluster(raw: string) {
  await env.NODES.put("nodes", raw);
}

export async function control(path: string, body?: unknown): Promise<any> {
  const res = await fetch(sim().controlUrl + path, body === undefined ? {} : { method: "POST", body: JSON.stringify(body), headers: { "content-type": "application/json" } });
  if (!res.ok) throw new Error(`control ${path}: ${res.status} ${await res.text()}`);
  return res.json();
}

/** Resets this file's engines (faults, stats, request logs); other files have their own. */
export const resetSim = () => control("/reset", {});
export const received = async (id: string): Promise<Array<{ path: string; headers: Record<string, string>; body: string }>> => control(`/engines/${id}/requests`);
export const fault = (id: string, f: Record<string, unknown>) => control(`/engines/${id}/fault`, f);

export function post(path: string, body: unknown, headers: Record<string, string> = {}) {
  return SELF.fetch(`http://router${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
}

export const chat = (content = "Hello there", extra: Record<string, unknown> = {}) => ({
  model: "sim-model",
  messages: [{ role: "user", content }],
  max_tokens: 4,
  ...extra,
});

/** Reads the cluster state snapshot (leases, in-flight load, health) from the Durable Object. */
export async function snapshot() {
  const stub = env.CLUSTER_STATE.get(env.CLUSTER_STATE.idFromName("cluster"));
  return stub.snapshot();
}

/** Waits until no lease is held and every node's in-flight load is zero (releases run in waitUntil). */
export async function expectNoLoad(timeoutMs = 5000) {
  const deadline = Date.now() + timeoutMs;
  let last: Awaited<ReturnType<typeof snapshot>> | null = null;
  while (Date.now() < deadline) {
    last = await snapshot();
    if (last.leases === 0 && last.nodes.every((n) => n.inflight.prefill === 0 && n.inflight.decode === 0)) return last;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`load leaked: ${JSON.stringify({ leases: last?.leases, nodes: last?.nodes.map((n) => [n.id, n.inflight]) })}`);
}

/**
 * Ends a node's ejection now, as if its breaker's time had run out: a test ejects for a minute
 * (so "open" holds however slow the machine is) and then moves on to half-open without waiting.
 */
export async function endEjection(node: string, pool = "cluster") {
  const stub = env.CLUSTER_STATE.get(env.CLUSTER_STATE.idFromName(pool)) as unknown;
  const run = runInDurableObject as unknown as (s: unknown, cb: (instance: any) => void) => Promise<void>;
  await run(stub, (instance) => {
    const h = instance.health.get(node);
    if (!h || h.ejectedUntil === 0) throw new Error(`${node} is not ejected`);
    h.ejectedUntil = Date.now() - 1;
  });
}

/** Forgets health, breaker, stickiness, prefix, recent-share, learned-rate and routing-precision state in the Durable Object, so tests do not leak into each other. */
export async function resetClusterState() {
  // typed loosely: the stub's RPC types are too deep for runInDurableObject's generics
  const stub = env.CLUSTER_STATE.get(env.CLUSTER_STATE.idFromName("cluster")) as unknown;
  const run = runInDurableObject as unknown as (s: unknown, cb: (instance: any) => void) => Promise<void>;
  await run(stub, (instance) => {
    instance.health.clear();
    instance.sticky.clear();
    instance.prefixes.index.prefill.clear();
    instance.prefixes.index.decode.clear();
    instance.recent.clear();
    instance.signals.clear();
    instance.rates.clear();
    instance.precision.clear();
    instance.cluster = null;
  });
}

/** Waits until the engine has seen its client (the router) go away, and returns its stats. */
export async function engineSawAbort(id: string, timeoutMs = 3000): Promise<any> {
  const deadline = Date.now() + timeoutMs;
  let stats: any;
  do {
    stats = await control(`/engines/${id}/stats`);
    if (stats.clientAborts >= 1) return stats;
    await new Promise((r) => setTimeout(r, 50));
  } while (Date.now() < deadline);
  throw new Error(`engine ${id} saw no client abort within ${timeoutMs} ms: ${JSON.stringify(stats)}`);
}

/** Three prefill and three decode engines of the test cluster. */
export const P3: NodeSpec[] = ["p0", "p1", "p2"].map((id) => ({ id, role: "prefill" }));
export const D3: NodeSpec[] = ["d0", "d1", "d2"].map((id) => ({ id, role: "decode" }));

/**
 * An object's snapshot through a new stub each try, or null when it stays unreachable: a stub that
 * met the object while reset() aborted it fails with "Network connection lost" (workerd does not
 * reuse a broken stub). An object that cannot be reached holds no live state either: its leases,
 * queue and view lived in the instance's memory, and a request of the file that needed it failed.
 */
async function snapshotOf(id: DurableObjectId): Promise<Awaited<ReturnType<typeof snapshot>> | null> {
  try {
    return await retryLostConnection(async () => (await env.CLUSTER_STATE.get(id).snapshot()) as Awaited<ReturnType<typeof snapshot>>);
  } catch (err) {
    if (String(err).includes("Network connection lost")) return null;
    throw err;
  }
}

async function retryLostConnection<T>(call: () => Promise<T>): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await call();
    } catch (err) {
      if (attempt === 8 || !String(err).includes("Network connection lost")) throw err;
      await new Promise((r) => setTimeout(r, 50 * attempt));
    }
  }
}

/**
 * The router as a new workerd has it, at the start of every test file (file-engines.ts): the files
 * of a pool worker share one workerd and one isolate (vitest.config.ts, isolate: false). Every
 * Durable Object is deleted — the whole cluster's, each pool's (`pool:<models>`) and the SignalPollers; memory
 * (view, leases, queue, health, stickiness, prefix index, signals, rates, precision, busy
 * windows, counters, history) and storage (saved view, last valid document, cursors, alarm) —
 * the KV namespace emptied, and the isolate's module caches (document, blocked addresses,
 * Mooncake engine ids) forgotten through their test seams.
 */
export async function resetRouter(): Promise<void> {
  // the document and the isolate's caches first: a late call of the previous file finds none
  for (let cursor: string | undefined; ; ) {
    const page = await env.NODES.list(cursor ? { cursor } : {});
    for (const key of page.keys) await env.NODES.delete(key.name);
    if (page.list_complete) break;
    cursor = page.cursor;
  }
  forgetConfigForTests();
  forgetBlockedForTests();
  forgetEngineIdsForTests();
  // Then the objects, until each id still listed holds nothing: on a loaded machine the previous
  // file's last waitUntil work (a finish report, a status read with the view) can reach an object
  // just after reset() and make it again; it is waited for, a few times, then named.
  for (let attempt = 1; ; attempt++) {
    await retryLostConnection(reset);
    const kept: string[] = [];
    for (const id of await retryLostConnection(() => listDurableObjectIds(env.CLUSTER_STATE))) {
      const s = await snapshotOf(id);
      if (s === null) kept.push(`${id.toString().slice(0, 8)} unreachable`);
      else if (s.version !== null || s.nodes.length > 0 || s.leases > 0) kept.push(`${id.toString().slice(0, 8)} ${JSON.stringify({ version: s.version, leases: s.leases })}`);
    }
    if (kept.length === 0) return;
    if (attempt === 5) throw new Error(`resetRouter: objects made again with the previous file's state after reset(): ${kept.join("; ")}`);
    await new Promise((r) => setTimeout(r, 200 * attempt));
  }
}

/**
 * After a file's last test: every request it made has ended — no lease held, nobody waiting at
 * the edge, in any pool's object. A file that leaves a stream open or a request waiting must end
 * it in its own afterAll; otherwise it would run on into the next file's fresh state.
 */
export async function expectFileQuiet(timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const busy: string[] = [];
    for (const id of await retryLostConnection(() => listDurableObjectIds(env.CLUSTER_STATE))) {
      const s = await snapshotOf(id);
      if (s === null) continue;
      const inflight = s.nodes.filter((n) => n.inflight.prefill > 0 || n.inflight.decode > 0);
      const waiting = s.admission.queued;
      if (s.leases > 0 || inflight.length > 0 || waiting > 0)
        busy.push(JSON.stringify({ id: id.toString().slice(0, 8), leases: s.leases, waiting, inflight: inflight.map((n) => [n.id, n.inflight]) }));
    }
    if (busy.length === 0) return;
    if (Date.now() > deadline) throw new Error(`this file left requests running after its last test (end them in its afterAll): ${busy.join(" ")}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}
