import { runInDurableObject } from "cloudflare:test";
import { beforeEach, describe, expect, it } from "vitest";
import type { ClusterView } from "../../src/state/types";
import { chatBody, engineRequests, kv, poll, post, putNodes, queued, resetEngines, resetState, setMetrics, snapshot, stub, useSignalsRig, waitFor } from "./signals-helpers";

useSignalsRig();

// Issue 25 item 3: an operator edits the document while requests wait at the edge (what one does
// to relieve a busy pool: add a decode node). The waiters are decided again under the document in
// force, and no isolate still holding the old document can flip the object back to it.

const decodeLegs = async (id: string) => (await engineRequests(id)).filter((r) => r.path === "/v1/chat/completions");

beforeEach(async () => {
  await resetState();
  await resetEngines();
  for (const id of ["p0", "d0", "d1"]) await setMetrics(id, kv(0.1));
});

describe("a document edit while requests wait", () => {
  it("a D added to relieve a busy pool serves the requests already waiting, with no other traffic", async () => {
    await setMetrics("d0", kv(0.97));
    const before = [
      { id: "p0", role: "prefill" as const },
      { id: "d0", role: "decode" as const },
    ];
    await putNodes(before, { admission: { queueMs: 15_000, maxQueued: 10 } });
    await poll();
    const answers: Array<Promise<Response>> = [];
    for (let i = 0; i < 3; i++) {
      answers.push(post("/v1/chat/completions", chatBody(`waiting ${i}`)));
      await waitFor(`request ${i} queued`, queued, (n) => n === i + 1);
    }
    // the operator adds d1; nothing else arrives: the waiting requests' own isolate sees the edit
    await putNodes([...before, { id: "d1", role: "decode" }], { admission: { queueMs: 15_000, maxQueued: 10 } });
    for (const res of await Promise.all(answers)) {
      expect(res.status, await res.clone().text()).toBe(200);
      expect(res.headers.get("x-pd-decode")).toBe("d1");
      await res.arrayBuffer();
    }
    expect(await decodeLegs("d1")).toHaveLength(3);
    expect(await decodeLegs("d0")).toHaveLength(0);
    await waitFor("released", snapshot, (s) => s.leases === 0 && s.admission.queued === 0);
  });

  it("a view read before the one in force never replaces it: its sender is told stale_view", async () => {
    await putNodes([
      { id: "p0", role: "prefill" },
      { id: "d0", role: "decode" },
    ]);
    await poll();
    // the view the Worker handed the object: the others below are it under other versions
    const run = runInDurableObject as unknown as (s: unknown, cb: (instance: any) => ClusterView) => Promise<ClusterView>;
    const inForce = await run(stub() as unknown, (instance) => instance.cluster);
    const view = (version: string, readAt: number): ClusterView => ({ ...inForce, version, readAt });
    const request = (version: string, cluster?: ClusterView) => ({
      version,
      ...(cluster ? { cluster } : {}),
      model: "sim-model",
      key: null,
      prefixHashes: [],
      tokens: 10,
      dryRun: true,
    });
    const s = stub() as unknown as { route(r: unknown): Promise<{ ok: boolean; error?: { kind: string } }> };
    const now = Date.now();
    expect((await s.route(request("edit-new", view("edit-new", now + 2000)))).ok).toBe(true);
    // an isolate that read the old document earlier sends it: refused, the newer stays in force
    expect(await s.route(request("edit-old", view("edit-old", now + 1000)))).toMatchObject({ ok: false, error: { kind: "stale_view" } });
    expect((await s.route(request("edit-new"))).ok).toBe(true);
    // the old text written again later (an operator reverting) is newer: it applies
    expect((await s.route(request("edit-old", view("edit-old", now + 3000)))).ok).toBe(true);
  });
});
