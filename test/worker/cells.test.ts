import { env, runDurableObjectAlarm, runInDurableObject, SELF } from "cloudflare:test";
import { afterAll, beforeEach, describe, expect, it } from "vitest";
import { withoutFileEngines } from "./helpers";
import { chatBody, engineFault, kv, putNodes, resetEngines, setMetrics, useSignalsRig, waitFor } from "./signals-helpers";

useSignalsRig();
withoutFileEngines();

// Cells (docs/scaling.md, "One object per cell within a pool"): `cells: 2` cuts the pool into two
// objects of disjoint nodes. The nodes are simulated engines behind fronts whose /metrics the test
// sets (signals-helpers.ts). Cut by routing/cells.ts: cell:0 = p0 (P) and d0 (D); cell:1 = d1 (D)
// and c0 (both).

const NODES = [
  { id: "p0", role: "prefill" as const },
  { id: "d0", role: "decode" as const },
  { id: "d1", role: "decode" as const },
  { id: "c0", role: "both" as const },
];
const CELLS = ["cluster/cell:0", "cluster/cell:1"];
const MEMBERS: Record<string, string[]> = { "cluster/cell:0": ["p0", "d0"], "cluster/cell:1": ["d1", "c0"] };
const cell = (name: string) => env.CLUSTER_STATE.get(env.CLUSTER_STATE.idFromName(name));
const run = runInDurableObject as unknown as (s: unknown, cb: (instance: any, state: DurableObjectState) => unknown) => Promise<unknown>;

const putCells = (extra: Record<string, unknown> = {}) =>
  putNodes(NODES, { cells: 2, policy: { prefill: "affinity", decode: "affinity" }, admission: { queueMs: 3000 }, ...extra });

function post(path: string, body: unknown, session: string, signal?: AbortSignal) {
  return SELF.fetch(`http://router${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", "x-session-id": session },
    body: JSON.stringify(body),
    ...(signal ? { signal } : {}),
  });
}

/** /v1/route for a session: the cells it tries, in order, and the one that would route it. */
async function explain(session: string): Promise<{ cell: string; cells: string[] }> {
  const res = await post("/v1/route", chatBody("which cell"), session);
  expect(res.status).toBe(200);
  return res.json();
}

/** A session whose first cell is `name` (found by asking /v1/route, deterministic: rendezvous of its key). */
async function sessionFirstIn(name: string): Promise<string> {
  for (let i = 0; i < 50; i++) if ((await explain(`conv-${i}`)).cells[0] === name) return `conv-${i}`;
  throw new Error(`no session starts in ${name}`);
}

/** Hands each cell its view (/metrics reads every cell with it), then runs each cell's alarm: a poll of its nodes. */
async function pollCells(): Promise<void> {
  await (await SELF.fetch("http://router/metrics")).arrayBuffer();
  for (const name of CELLS) await runDurableObjectAlarm(cell(name) as never);
}

const snapshotOf = (name: string) => cell(name).snapshot();

beforeEach(async () => {
  for (const name of CELLS)
    await run(cell(name), (instance) => {
      instance.health.clear();
      instance.sticky.clear();
      instance.signals.clear();
      instance.cluster = null;
    });
  await resetEngines();
  for (const node of NODES) await setMetrics(node.id, kv(0.1));
});

afterAll(async () => {
  await resetEngines();
});

describe("a conversation and its cell", () => {
  it("one conversation always meets the same cell over many turns; conversations spread over the cells", async () => {
    await putCells();
    await pollCells();
    const seen = new Map<string, Set<string>>();
    for (let turn = 0; turn < 4; turn++) {
      // an odd number: a round robin over two cells would move each conversation every turn
      for (let i = 0; i < 7; i++) {
        const session = `conv-${i}`;
        const res = await post("/v1/chat/completions", chatBody(`turn ${turn} of ${session}`), session);
        expect(res.status, await res.clone().text()).toBe(200);
        await res.arrayBuffer();
        const [p, d] = [res.headers.get("x-pd-prefill")!, res.headers.get("x-pd-decode")!];
        const home = CELLS.find((c) => MEMBERS[c]!.includes(d))!;
        // P and D of one request come from one cell
        expect(MEMBERS[home]).toContain(p);
        seen.set(session, (seen.get(session) ?? new Set()).add(home));
      }
    }
    for (const [session, homes] of seen) expect([session, homes.size]).toEqual([session, 1]);
    const used = new Set([...seen.values()].flatMap((h) => [...h]));
    expect([...used].sort()).toEqual(CELLS);
    // each cell's object counted only its own nodes' requests
    const [a, b] = await Promise.all(CELLS.map(snapshotOf));
    expect(a!.nodes.map((n) => n.id).sort()).toEqual(["d0", "p0"]);
    expect(b!.nodes.map((n) => n.id).sort()).toEqual(["c0", "d1"]);
    // operators see every node with its cell
    const metrics = await (await SELF.fetch("http://router/metrics")).text();
    for (const name of CELLS) for (const node of MEMBERS[name]!) expect(metrics).toContain(`pd_router_node_cell{node="${node}",cell="${name}"} 1`);
    const status: any = await (await SELF.fetch("http://router/status.json")).json().catch(() => null);
    if (status?.nodes) for (const n of status.nodes) expect(MEMBERS[n.cell]).toContain(n.id);
  });
});

describe("a busy cell", () => {
  it("spills to the next cell: answered at once by a node of the other cell", async () => {
    await putCells();
    const session = await sessionFirstIn("cluster/cell:0");
    // cell:0's only decode node is over kvBusy
    await setMetrics("d0", kv(0.97));
    await pollCells();
    const res = await post("/v1/chat/completions", chatBody("spill me"), session);
    expect(res.status, await res.clone().text()).toBe(200);
    await res.arrayBuffer();
    expect(MEMBERS["cluster/cell:1"]).toContain(res.headers.get("x-pd-decode"));
    // it did not wait at the edge
    expect(res.headers.get("server-timing")).not.toContain("queue;");
    expect((await snapshotOf("cluster/cell:0")).admission.queued).toBe(0);
    // the dry run names the cell that would take it
    expect((await explain(session)).cell).toBe("cluster/cell:1");
  });

  it("waits at the edge in its first cell when every cell is busy, and is admitted there when a node frees", async () => {
    await putCells({ admission: { queueMs: 15_000 } });
    const session = await sessionFirstIn("cluster/cell:1");
    for (const id of ["d0", "d1", "c0"]) await setMetrics(id, kv(0.97));
    await pollCells();
    const answer = post("/v1/chat/completions", chatBody("wait for me"), session);
    await waitFor(
      "queued in its first cell",
      () => snapshotOf("cluster/cell:1"),
      (s) => s.admission.queued === 1,
    );
    expect((await snapshotOf("cluster/cell:0")).admission.queued).toBe(0);
    await setMetrics("d1", kv(0.1));
    await pollCells();
    const res = await answer;
    expect(res.status, await res.clone().text()).toBe(200);
    await res.arrayBuffer();
    expect(res.headers.get("x-pd-decode")).toBe("d1");
    expect(res.headers.get("server-timing")).toContain("queue;");
  });
});

describe("a stored response's turn", () => {
  it("reaches the node that stored it, in its cell, whichever cell its id ranks first", async () => {
    await putCells();
    await pollCells();
    const body = (input: string, extra: Record<string, unknown> = {}) => ({ model: "sim-model", input, max_output_tokens: 3, ...extra });
    const homes = new Set<string>();
    for (let c = 0; c < 6; c++) {
      const res = await post("/v1/responses", body(`stored conversation ${c}`), `stored-${c}`);
      expect(res.status, await res.clone().text()).toBe(200);
      const first = { id: ((await res.json()) as { id: string }).id, d: res.headers.get("x-pd-decode")! };
      const home = CELLS.find((name) => MEMBERS[name]!.includes(first.d))!;
      homes.add(home);
      // the finish report that remembers the nodes runs after the response: let it land
      await waitFor(
        "the first turn finished",
        () => snapshotOf(home),
        (s) => s.leases === 0,
      );
      // its id is its only tie to the first turn, and ranks either cell first
      const next = await post("/v1/responses", body(`unrelated follow-up ${c}`, { previous_response_id: first.id }), `other-${c}`);
      expect(next.status, await next.clone().text()).toBe(200);
      await next.arrayBuffer();
      expect({ c, d: next.headers.get("x-pd-decode") }).toEqual({ c, d: first.d });
    }
    expect(homes.size).toBe(2);
  });
});

describe("a cell's restart", () => {
  it("loses what its own object held and no lease of another cell", async () => {
    await putCells();
    await pollCells();
    // cell:0 has served a request; a request's decode leg hangs in cell:1, holding its lease there
    const answered = await post("/v1/chat/completions", chatBody("served in cell:0"), await sessionFirstIn(CELLS[0]!));
    expect(answered.status).toBe(200);
    await answered.arrayBuffer();
    const servedBy = (s: Awaited<ReturnType<typeof snapshotOf>>) => s.nodes.reduce((n, x) => n + x.requestsTotal.decode, 0);
    expect(servedBy(await snapshotOf(CELLS[0]!))).toBeGreaterThan(0);
    for (const id of ["d1", "c0"]) await engineFault(id, { mode: "hang", count: 1 });
    const client = new AbortController();
    const held = post("/v1/chat/completions", chatBody("hold a lease in cell:1", { stream: true }), await sessionFirstIn(CELLS[1]!), client.signal).catch(() => null);
    await waitFor(
      "a lease in cell:1",
      () => snapshotOf(CELLS[1]!),
      (s) => s.leases === 1,
    );
    // cell:0's object restarts: everything in its memory is gone (its counters too; its view comes back from storage)
    await run(cell(CELLS[0]!), (_instance, state) => state.abort("restart")).catch(() => null);
    expect(servedBy(await snapshotOf(CELLS[0]!))).toBe(0);
    expect((await snapshotOf(CELLS[1]!)).leases).toBe(1);
    client.abort();
    await held;
    await waitFor(
      "cell:1's lease released in its own cell",
      () => snapshotOf(CELLS[1]!),
      (s) => s.leases === 0,
    );
  });
});

// The document's validation (src/config/schema.ts with the checks that need its pools, plan.ts withPlanLimits)
describe("the cells setting", () => {
  it("is refused when a cell would get no node of a role it needs, naming the cell", async () => {
    const { parseClusterDocument } = await import("../../src/config/schema");
    const { withPlanLimits } = await import("../../src/config/plan");
    const doc = (cells: unknown) => ({ protocol: "vllm", cells, nodes: NODES.map((n) => ({ ...n, url: `http://${n.id}.test` })) });
    const three = parseClusterDocument(doc(3), withPlanLimits({}));
    expect(three.ok).toBe(false);
    expect(!three.ok && three.problems).toEqual([
      { path: "cells", message: expect.stringMatching(/^3 cells: cell cluster\/cell:\d of pool cluster \(4 nodes\) would have no prefill-capable node/) },
    ]);
    for (const [value, message] of [
      [0, "Number must be greater than 0"],
      [65, "must be at most 64"],
      [1.5, "Expected integer, received float"],
    ] as const) {
      const parsed = parseClusterDocument(doc(value), withPlanLimits({}));
      expect(!parsed.ok && parsed.problems.find((p) => p.path === "cells")?.message).toBe(message);
    }
    expect(parseClusterDocument(doc(2), withPlanLimits({})).ok).toBe(true);
  });
});
