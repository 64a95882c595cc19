import { env, runDurableObjectAlarm, runInDurableObject, SELF } from "cloudflare:test";
import { afterAll, beforeAll, expect, inject } from "vitest";
import type { MetricsMode } from "../support/metrics-front";

// Nodes with a steerable /metrics (test/signals-global-setup.ts) and the cluster around them:
// each test file that calls useSignalsRig() at its top gets a rig of its own for its whole run.

interface SignalsRig {
  id: string;
  controlUrl: string;
  simControlUrl: string;
  nodes: Record<string, string>;
}

// Module state of one test file: this module is shared by the files a pool worker runs one after
// the other (vitest.config.ts, isolate: false), so file-engines.ts resets it for every file.
let rig: SignalsRig | null = null;

export function beginSignalsFile(): void {
  rig = null;
}

/**
 * Called at the top of a test file that uses the rig: registers the hooks that start it before the
 * file's first test and stop it after its last. (Hooks at this module's top level would run for
 * the first file that imports it only: the module is evaluated once per pool worker.)
 */
export function useSignalsRig(): void {
  beforeAll(async () => {
    const res = await fetch(`${inject("signalsFactory")}/rigs`, { method: "POST" });
    if (!res.ok) throw new Error(`could not start this file's signals rig: ${res.status} ${await res.text()}`);
    rig = (await res.json()) as SignalsRig;
  });
  afterAll(async () => {
    if (!rig) return;
    const { id } = rig;
    rig = null;
    await (await fetch(`${inject("signalsFactory")}/rigs/${id}`, { method: "DELETE" })).arrayBuffer();
  });
}

export const signalsRig = (): SignalsRig => {
  if (!rig) throw new Error("no signals rig: signalsRig() runs before the file's beforeAll, or the file did not call useSignalsRig()");
  return rig;
};
export const nodeUrl = (id: string) => signalsRig().nodes[id]!;

export async function setMetrics(id: string, mode: MetricsMode): Promise<void> {
  const res = await fetch(`${signalsRig().controlUrl}/fronts/${id}/metrics`, { method: "POST", body: JSON.stringify(mode) });
  if (!res.ok) throw new Error(`set metrics ${id}: ${res.status}`);
}

export async function frontStats(id: string): Promise<{ metricsRequests: number; metricsPending: number; metricsCut: number; proxied: number }> {
  return (await fetch(`${signalsRig().controlUrl}/fronts/${id}/stats`)).json();
}

export const kv = (kvUsage: number, extra: { waiting?: number; running?: number; capacityTokens?: number } = {}): MetricsMode => ({
  mode: "override",
  values: { kvUsage, waiting: extra.waiting ?? 0, running: extra.running ?? 1, ...(extra.capacityTokens !== undefined ? { capacityTokens: extra.capacityTokens } : {}) },
});

/** Engine requests the simulator recorded for a node (what reached it). */
export async function engineRequests(id: string): Promise<Array<{ path: string; headers: Record<string, string>; body: string }>> {
  return (await fetch(`${signalsRig().simControlUrl}/engines/${id}/requests`)).json();
}

/** Makes a node's engine misbehave (sim/cluster.mjs `fault`: e.g. `{ mode: "hang", count: 1 }`). */
export async function engineFault(id: string, fault: Record<string, unknown>): Promise<void> {
  const res = await fetch(`${signalsRig().simControlUrl}/engines/${id}/fault`, { method: "POST", body: JSON.stringify(fault) });
  if (!res.ok) throw new Error(`fault ${id}: ${res.status}`);
  await res.arrayBuffer();
}

export async function resetEngines(): Promise<void> {
  await fetch(`${signalsRig().simControlUrl}/reset`, { method: "POST", body: "{}" });
}

/** A document over the fronted nodes; long intervals so only a test's own alarm runs poll. */
export async function putNodes(ids: Array<{ id: string; role: "prefill" | "decode" | "both" }>, extra: Record<string, unknown> = {}): Promise<void> {
  const doc = {
    protocol: "vllm",
    policy: { prefill: "round_robin", decode: "round_robin" },
    health: { intervalMs: 600_000 },
    signals: { intervalMs: 600_000, staleMs: 1_200_000 },
    ...extra,
    nodes: ids.map((n) => ({ ...n, url: nodeUrl(n.id) })),
  };
  await env.NODES.put("nodes", JSON.stringify(doc));
}

export const stub = () => env.CLUSTER_STATE.get(env.CLUSTER_STATE.idFromName("cluster"));

/** Forgets what a previous test left in the object (health, stickiness, prefix index and its hit feedback, signals, learned rates, routing precision, the view), once its leases are released. */
export async function resetState(): Promise<void> {
  // a request's end reaches the object off its response's path: an earlier test's client can have
  // its answer while its lease is still held, a load the next test would meet (a prefill in flight
  // keeps a node from being a D). Leases are not cleared but waited for: a test that leaks one fails here.
  await waitFor("the earlier test's leases released", snapshot, (s) => s.leases === 0, 10_000);
  const run = runInDurableObject as unknown as (s: unknown, cb: (instance: any) => void) => Promise<void>;
  await run(stub() as unknown, (instance) => {
    instance.health.clear();
    instance.sticky.clear();
    instance.prefixes.index.prefill.clear();
    instance.prefixes.index.decode.clear();
    instance.prefixes.rates.clear();
    instance.prefixes.feedback.clear();
    instance.signals.clear();
    instance.rates.clear();
    instance.precision.clear();
    instance.cluster = null;
  });
}

/** Hands the document to the object (a dry run carries the view), then runs its alarm: a poll of every node. */
export async function poll(): Promise<void> {
  const res = await post("/v1/route", chatBody("sync"));
  await res.arrayBuffer();
  await runDurableObjectAlarm(stub() as never);
}

export function post(path: string, body: unknown, init: RequestInit = {}) {
  return SELF.fetch(`http://router${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body), ...init });
}

/** POST /v1/route: the decision this body would get (200 expected). */
export async function explain(body: unknown): Promise<any> {
  const res = await post("/v1/route", body);
  expect(res.status).toBe(200);
  return res.json();
}

/** Sends a chat body (200 expected, its answer read to the end); returns its route receipt. */
export async function sendChat(body: unknown): Promise<{ mode: string | null; p: string | null; d: string | null }> {
  const res = await post("/v1/chat/completions", body);
  expect(res.status, await res.clone().text()).toBe(200);
  await res.arrayBuffer();
  return { mode: res.headers.get("x-pd-mode"), p: res.headers.get("x-pd-prefill"), d: res.headers.get("x-pd-decode") };
}

/** The completion requests a node's engine got (its other endpoints apart), their bodies parsed. */
export const completionsTo = async (id: string) => (await engineRequests(id)).filter((r) => r.path.startsWith("/v1/")).map((r) => JSON.parse(r.body) as Record<string, unknown>);

export const chatBody = (content: string, extra: Record<string, unknown> = {}) => ({ model: "sim-model", messages: [{ role: "user", content }], max_tokens: 2, ...extra });

/** Requests waiting at the edge for a decode node, in the pool's object. */
export const queued = async () => (await snapshot()).admission.queued;

export async function snapshot() {
  return stub().snapshot();
}

export async function waitFor<T>(what: string, read: () => Promise<T>, ok: (v: T) => boolean, ms = 5000): Promise<T> {
  const deadline = Date.now() + ms;
  let last = await read();
  while (!ok(last)) {
    if (Date.now() > deadline) throw new Error(`${what}: not reached in ${ms} ms; last ${JSON.stringify(last)}`);
    await new Promise((r) => setTimeout(r, 25));
    last = await read();
  }
  return last;
}
