import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { AdmissionQueue } from "../../../src/state/admission-queue";
import { AlarmSchedule } from "../../../src/state/alarm-schedule";
import { ADMISSION_RESERVATION_MS, EdgeAdmission } from "../../../src/state/edge-admission";
import { LeaseTable } from "../../../src/state/leases";
import type { RouteRequest, RouteResponse } from "../../../src/state/types";
import { clusterView, decision, routeRequest, viewNode } from "./fixtures";
import { withoutFileEngines } from "../helpers";

withoutFileEngines();

const S = { queueMs: 1000, maxQueued: 3 };
const DEFAULT = { tier: "default", flow: "" } as const;

describe("the admission queue", () => {
  it("is bounded, first come first served, and lets a waiter leave", () => {
    const q = new AdmissionQueue<string>();
    expect(q.enqueue("a", "A", DEFAULT, 0, S).ok).toBe(true);
    expect(q.enqueue("b", "B", DEFAULT, 1, S).ok).toBe(true);
    expect(q.enqueue("c", "C", DEFAULT, 2, S).ok).toBe(true);
    expect(q.enqueue("d", "D", DEFAULT, 3, S)).toEqual({ ok: false, reason: "queue_full" });
    expect(q.leave("b")?.item).toBe("B");
    expect(q.leave("b")).toBeNull();
    const order: string[] = [];
    q.admit((w) => (order.push(w.item), true));
    expect(order).toEqual(["A", "C"]);
    expect(q.size).toBe(0);
  });

  it("expires waiters at their deadline and names the next one", () => {
    const q = new AdmissionQueue<string>();
    q.enqueue("a", "A", DEFAULT, 0, S);
    q.enqueue("b", "B", DEFAULT, 500, S);
    expect(q.nextDeadline()).toBe(1000);
    expect(q.expire(999)).toHaveLength(0);
    expect(q.expire(1000).map((w) => w.item)).toEqual(["A"]);
    expect(q.nextDeadline()).toBe(1500);
  });

  it("admits in arrival order among waiters that compete for the same capacity (property)", () => {
    fc.assert(
      fc.property(fc.array(fc.constantFrom("m1", "m2"), { maxLength: 30 }), fc.nat(10), fc.nat(10), (models, room1, room2) => {
        const q = new AdmissionQueue<string>();
        models.forEach((m, i) => q.enqueue(String(i), m, DEFAULT, i, { queueMs: 1e9, maxQueued: 1000 }));
        const room: Record<string, number> = { m1: room1, m2: room2 };
        const admitted: number[] = [];
        q.admit((w) => {
          if (room[w.item]! <= 0) return false;
          room[w.item]!--;
          admitted.push(Number(w.ticket));
          return true;
        });
        for (const m of ["m1", "m2"]) {
          const mine = models
            .map((x, i) => [x, i] as const)
            .filter(([x]) => x === m)
            .map(([, i]) => i);
          const got = admitted.filter((i) => models[i] === m);
          expect(got).toEqual(mine.slice(0, got.length));
        }
      }),
    );
  });
});

describe("two schedules on one alarm", () => {
  const periods = { probe: 10_000, poll: 5_000 };
  it("fires for the earliest job and runs what is due", () => {
    const s = new AlarmSchedule();
    s.configure(periods, 0);
    expect(s.next()).toBe(5_000);
    expect(s.take(periods, 5_000)).toEqual(["poll"]);
    expect(s.next()).toBe(10_000);
    expect(s.take(periods, 10_000).sort()).toEqual(["poll", "probe"]);
  });

  it("an alarm run early (nothing due) runs every job", () => {
    const s = new AlarmSchedule();
    s.configure(periods, 0);
    expect(s.take(periods, 1).sort()).toEqual(["poll", "probe"]);
  });

  it("a new document with a shorter period brings the job forward", () => {
    const s = new AlarmSchedule();
    s.configure(periods, 0);
    s.configure({ probe: 10_000, poll: 1_000 }, 100);
    expect(s.next()).toBe(1_100);
  });
});

// Admission at the edge, without the runtime: route calls that found every decode node busy wait
// first come first served and are offered what frees; the object only says when to look again.

const VIEW = clusterView([viewNode("p0", "prefill"), viewNode("d0", "decode")]);

/** A route that admits while `room` lasts (per model), taking the lease as the object would. */
function router(leases: LeaseTable, room: Record<string, number>) {
  const routed: string[] = [];
  const route = (req: RouteRequest): RouteResponse => {
    if ((room[req.model] ?? 0) <= 0) return { ok: false, error: { kind: "decode_busy", candidates: [] } };
    room[req.model]! -= 1;
    routed.push(req.leaseId!);
    leases.take(req.leaseId!, { prefill: "p0", decode: "d0", tokens: 1, expiresAt: 1e12, route: "r", fallbacks: { prefill: [], decode: [] }, model: req.model });
    return { ok: true, leaseId: req.leaseId!, decision: decision("p0", "d0") };
  };
  return { route, routed };
}

/** Answers arrive through promises: collect them in order. */
function answers(): { got: Array<[string, RouteResponse]>; track: (id: string, p: Promise<RouteResponse>) => void } {
  const got: Array<[string, RouteResponse]> = [];
  return { got, track: (id, p) => void p.then((r) => got.push([id, r])) };
}
const settle = () => new Promise((r) => setTimeout(r, 0));

describe("waiting at the edge", () => {
  it("admits in arrival order as capacity frees, answering how long each waited; the admitted lease is a reservation", async () => {
    const a = new EdgeAdmission();
    const leases = new LeaseTable(60_000);
    const { got, track } = answers();
    for (const [id, t] of [
      ["a", 0],
      ["b", 10],
      ["c", 20],
    ] as const)
      track(id, a.wait(routeRequest(), id, t, S, 5));
    expect(a.size).toBe(3);
    const room = { m: 0 };
    const { route } = router(leases, room);
    a.offer(100, VIEW, leases, route);
    expect(a.size).toBe(3);
    room.m = 2;
    a.offer(300, VIEW, leases, route);
    await settle();
    expect(got.map(([id, r]) => [id, r.ok && r.queuedMs])).toEqual([
      ["a", 300],
      ["b", 290],
    ]);
    expect(leases.get("a")?.expiresAt).toBe(300 + ADMISSION_RESERVATION_MS);
    expect(a.reserving).toBe(true);
    expect(a.status()).toMatchObject({ queued: 1, wait: { count: 2 }, rejected: [] });
    // the queue's next deadline (c: 20 + queueMs) comes before the reservations' end
    expect(a.nextWake()).toBe(1_020);
  });

  it("a reservation is short, and never longer than the lease TTL", () => {
    const a = new EdgeAdmission();
    const leases = new LeaseTable(1_000);
    void a.wait(routeRequest(), "a", 0, S, 5);
    a.offer(10, VIEW, leases, router(leases, { m: 1 }).route);
    expect(leases.get("a")?.expiresAt).toBe(1_010);
    expect(a.nextWake()).toBe(1_010);
  });

  it("refused at once, 503 cluster_busy queue_full, when the queue is full or queueMs is 0", async () => {
    const a = new EdgeAdmission();
    for (const id of ["a", "b", "c"]) void a.wait(routeRequest(), id, 0, S, 5);
    expect(await a.wait(routeRequest(), "d", 0, S, 5)).toEqual({ ok: false, error: { kind: "cluster_busy", reason: "queue_full", retryAfterS: 5 } });
    expect(await new EdgeAdmission().wait(routeRequest(), "e", 0, { queueMs: 0, maxQueued: 3 }, 1)).toMatchObject({ error: { reason: "queue_full" } });
    expect(a.status().rejected).toEqual([{ reason: "queue_full", tier: "default", count: 1 }]);
  });

  it("503 cluster_busy timeout once queueMs has passed, with retry-after from signals.intervalMs", async () => {
    const a = new EdgeAdmission();
    const leases = new LeaseTable(60_000);
    const { got, track } = answers();
    track("a", a.wait(routeRequest(), "a", 0, S, 5));
    a.offer(999, VIEW, leases, router(leases, { m: 0 }).route);
    a.offer(1_000, clusterView(VIEW.nodes, { signals: { intervalMs: 2_500, staleMs: 15_000, kvBusy: 0.9, queueBusy: 8 } }), leases, router(leases, { m: 5 }).route);
    await settle();
    expect(got).toEqual([["a", { ok: false, error: { kind: "cluster_busy", reason: "timeout", retryAfterS: 3 } }]]);
    expect(a.size).toBe(0);
    expect(a.status().rejected).toEqual([{ reason: "timeout", tier: "default", count: 1 }]);
  });

  it("a client that leaves: out of the queue, answered client_gone, never given a lease", async () => {
    const a = new EdgeAdmission();
    const leases = new LeaseTable(60_000);
    const { got, track } = answers();
    track("a", a.wait(routeRequest(), "a", 0, S, 5));
    a.leave("a");
    const { route, routed } = router(leases, { m: 1 });
    a.offer(10, VIEW, leases, route);
    await settle();
    expect(got).toEqual([["a", { ok: false, error: { kind: "client_gone" } }]]);
    expect(routed).toEqual([]);
    expect(a.nextWake()).toBeNull();
  });

  it("a request that waited through a document edit is decided under the document in force, and told its version (its Worker reloads it)", async () => {
    const a = new EdgeAdmission();
    const leases = new LeaseTable(60_000);
    const p = a.wait(routeRequest({ version: "v0" }), "a", 0, S, 5);
    a.offer(10, VIEW, leases, router(leases, { m: 1 }).route);
    expect(await p).toMatchObject({ ok: true, version: VIEW.version });
  });

  it("once a model is refused in a pass, later requests for it wait too; other models and pinned requests are still tried", async () => {
    const a = new EdgeAdmission();
    const leases = new LeaseTable(60_000);
    const tried: string[] = [];
    const { route } = router(leases, { m: 0, n: 1 });
    void a.wait(routeRequest({ model: "m" }), "m1", 0, S, 5);
    void a.wait(routeRequest({ model: "m" }), "m2", 0, S, 5);
    void a.wait(routeRequest({ model: "m", pinned: true }), "m3", 0, S, 5);
    void a.wait(routeRequest({ model: "n" }), "n1", 0, { ...S, maxQueued: 4 }, 5);
    a.offer(10, VIEW, leases, (req) => (tried.push(req.leaseId!), route(req)));
    expect(tried).toEqual(["m1", "m3", "n1"]);
    expect(a.size).toBe(3);
  });

  it("a reservation ends when its Worker confirms it, its lease is released, or its time is up", () => {
    const a = new EdgeAdmission();
    const leases = new LeaseTable(60_000);
    for (const id of ["a", "b", "c"]) void a.wait(routeRequest(), id, 0, S, 5);
    a.offer(0, VIEW, leases, router(leases, { m: 3 }).route);
    expect(a.unreserve("a")).toBe(true);
    expect(a.unreserve("a")).toBe(false);
    leases.release("b");
    a.offer(1, VIEW, leases, router(leases, {}).route);
    expect(a.unreserve("b")).toBe(false);
    expect(a.nextWake()).toBe(ADMISSION_RESERVATION_MS);
    a.offer(ADMISSION_RESERVATION_MS, VIEW, leases, router(leases, {}).route);
    expect(a.reserving).toBe(false);
    expect(a.nextWake()).toBeNull();
  });

  it("arrival order is kept among requests that compete for the same capacity (property)", async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(fc.constantFrom("m", "n"), { maxLength: 20 }), fc.array(fc.record({ m: fc.nat(3), n: fc.nat(3) }), { maxLength: 6 }), async (models, frees) => {
        const a = new EdgeAdmission();
        const leases = new LeaseTable(60_000);
        const { got, track } = answers();
        models.forEach((model, i) => track(String(i), a.wait(routeRequest({ model }), String(i), i, { queueMs: 1e9, maxQueued: 100 }, 5)));
        const room = { m: 0, n: 0 };
        const { route } = router(leases, room);
        for (const free of frees) {
          room.m += free.m;
          room.n += free.n;
          a.offer(100, VIEW, leases, route);
        }
        await settle();
        for (const model of ["m", "n"]) {
          const arrived = models.flatMap((x, i) => (x === model ? [String(i)] : []));
          const admitted = got.map(([id]) => id).filter((id) => models[Number(id)] === model);
          expect(admitted).toEqual(arrived.slice(0, admitted.length));
        }
      }),
    );
  });
});

describe("a dry run that would wait (/v1/route)", () => {
  it("shows the picks it would get, the decode candidates as they are now, and the queue it would join", () => {
    const a = new EdgeAdmission();
    void a.wait(routeRequest(), "a", 0, S, 5);
    const busy = [{ id: "d0", load: 1, healthy: true, drain: false, group: "g", busy: true }];
    const answer = a.wouldWait({ ok: true, leaseId: null, decision: decision("p0", "d0") }, busy);
    expect(answer).toMatchObject({ ok: true, leaseId: null, wouldWait: { queued: 1 }, decision: { prefill: { id: "p0" }, decode: { id: "d0", candidates: busy } } });
    expect(a.wouldWait({ ok: false, error: { kind: "no_nodes", role: "decode" } }, busy)).toEqual({ ok: false, error: { kind: "no_nodes", role: "decode" } });
  });
});
