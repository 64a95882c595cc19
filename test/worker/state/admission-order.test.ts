import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { parseKeyEntry, requestTier, tierOf } from "../../../src/auth/service-tier";
import { vllmPriorityOf, withPriority } from "../../../src/forward/priority";
import { AdmissionQueue, ranksBefore, TIERS, type Tier } from "../../../src/state/admission-queue";
import { EdgeAdmission, predictQueuedTtftMs } from "../../../src/state/edge-admission";
import { LeaseTable } from "../../../src/state/leases";
import type { RouteRequest, RouteResponse } from "../../../src/state/types";
import { clusterView, decision, routeRequest, viewNode } from "./fixtures";
import { withoutFileEngines } from "../helpers";

withoutFileEngines();

// The edge queue's order (SPEC 9): tier first, then a fair share across API keys (start-time fair
// queueing: each key's requests take turns), then the earliest deadline; a full queue sheds the
// lowest tier first. Pure: no runtime, no clock.

const OPEN = { queueMs: 1e9, maxQueued: 10_000 };
const cls = (tier: Tier, flow = "") => ({ tier, flow });

/** Admits everything, in the queue's order: the tickets. */
function drain<T>(q: AdmissionQueue<T>): string[] {
  const out: string[] = [];
  q.admit((w) => (out.push(w.ticket), true));
  return out;
}

describe("the queue's order", () => {
  it("a higher tier first; within a tier, first come first served", () => {
    const q = new AdmissionQueue<null>();
    q.enqueue("flex-1", null, cls("flex"), 0, OPEN);
    q.enqueue("default-1", null, cls("default"), 1, OPEN);
    q.enqueue("priority-1", null, cls("priority"), 2, OPEN);
    q.enqueue("flex-2", null, cls("flex"), 3, OPEN);
    q.enqueue("priority-2", null, cls("priority"), 4, OPEN);
    expect(drain(q)).toEqual(["priority-1", "priority-2", "default-1", "flex-1", "flex-2"]);
  });

  it("keys level in their turns: the earliest deadline first (a queueMs shortened meanwhile)", () => {
    const q = new AdmissionQueue<null>();
    q.enqueue("late", null, cls("default", "A"), 0, { queueMs: 5_000, maxQueued: 10 });
    q.enqueue("soon", null, cls("default", "B"), 1, { queueMs: 1_000, maxQueued: 10 });
    expect(drain(q)).toEqual(["soon", "late"]);
  });

  it("keys take turns: one key's flood does not hold back another key's requests", () => {
    const q = new AdmissionQueue<null>();
    for (let i = 0; i < 6; i++) q.enqueue(`a${i}`, null, cls("default", "A"), i, OPEN);
    q.enqueue("b0", null, cls("default", "B"), 10, OPEN);
    q.enqueue("b1", null, cls("default", "B"), 11, OPEN);
    expect(drain(q)).toEqual(["a0", "b0", "a1", "b1", "a2", "a3", "a4", "a5"]);
  });

  it("a key that arrives late starts level with the keys being served, not ahead of what they already waited for", () => {
    const q = new AdmissionQueue<null>();
    for (let i = 0; i < 4; i++) q.enqueue(`a${i}`, null, cls("default", "A"), i, OPEN);
    let taken = 0;
    q.admit(() => taken++ < 2); // a0, a1 served
    q.enqueue("b0", null, cls("default", "B"), 10, OPEN);
    expect(drain(q)).toEqual(["a2", "b0", "a3"]);
  });

  it("a key whose waiters left unadmitted gets their turns back: its client gone, or its time run out", () => {
    const gone = new AdmissionQueue<null>();
    gone.enqueue("a0", null, cls("default", "A"), 0, OPEN);
    gone.enqueue("a1", null, cls("default", "A"), 1, OPEN);
    gone.enqueue("b0", null, cls("default", "B"), 2, OPEN);
    gone.leave("a0");
    gone.leave("a1");
    gone.enqueue("a2", null, cls("default", "A"), 3, OPEN);
    gone.enqueue("b1", null, cls("default", "B"), 4, OPEN);
    // a2 is A's first turn now, level with b0 (which came first), ahead of B's second
    expect(drain(gone)).toEqual(["b0", "a2", "b1"]);

    const expired = new AdmissionQueue<null>();
    const SHORT = { queueMs: 10, maxQueued: 100 };
    expired.enqueue("a0", null, cls("default", "A"), 0, SHORT);
    expired.enqueue("a1", null, cls("default", "A"), 1, SHORT);
    expired.enqueue("a2", null, cls("default", "A"), 2, OPEN);
    expired.enqueue("b0", null, cls("default", "B"), 3, OPEN);
    expect(expired.expire(20).map((w) => w.ticket)).toEqual(["a0", "a1"]);
    expired.enqueue("b1", null, cls("default", "B"), 21, OPEN);
    expect(drain(expired)).toEqual(["a2", "b0", "b1"]);
  });

  it("waiters that left unadmitted leave the order as if they had never come (property)", () => {
    fc.assert(
      fc.property(
        fc.array(fc.record({ tier: fc.constantFrom(...TIERS), flow: fc.constantFrom("A", "B", "C"), ends: fc.constantFrom("stays", "leaves", "expires") }), { maxLength: 30 }),
        (arrivals) => {
          const q = new AdmissionQueue<null>();
          const never = new AdmissionQueue<null>();
          arrivals.forEach((a, i) => {
            q.enqueue(String(i), null, cls(a.tier, a.flow), i, a.ends === "expires" ? { queueMs: 100, maxQueued: 100 } : OPEN);
            if (a.ends === "stays") never.enqueue(String(i), null, cls(a.tier, a.flow), i, OPEN);
          });
          arrivals.forEach((a, i) => a.ends === "leaves" && q.leave(String(i)));
          q.expire(1_000);
          expect(drain(q)).toEqual(drain(never));
        },
      ),
    );
  });

  it("fair share off (one flow): arrival order whatever the key", () => {
    const q = new AdmissionQueue<null>();
    const none = { ...OPEN, fairShare: "none" as const };
    for (const [t, flow] of [
      ["a0", ""],
      ["a1", ""],
      ["b0", ""],
    ] as const)
      q.enqueue(t, null, cls("default", flow), 0, none);
    expect(drain(q)).toEqual(["a0", "a1", "b0"]);
  });

  it("a newcomer's place: the waiters ahead of it that compete", () => {
    const q = new AdmissionQueue<string>();
    q.enqueue("m", "m", cls("default"), 0, OPEN);
    q.enqueue("n", "n", cls("default"), 1, OPEN);
    q.enqueue("f", "m", cls("flex"), 2, OPEN);
    expect(q.ahead(q.probe(cls("default"), 3, OPEN), (w) => w.item === "m")).toBe(1);
    expect(q.ahead(q.probe(cls("priority"), 3, OPEN))).toBe(0);
    expect(q.ahead(q.probe(cls("flex"), 3, OPEN))).toBe(3);
  });

  it("is one order (property): total, and the list is kept in it whatever the arrivals", () => {
    const arrival = fc.record({ tier: fc.constantFrom(...TIERS), flow: fc.constantFrom("", "A", "B", "C"), queueMs: fc.constantFrom(1_000, 5_000) });
    fc.assert(
      fc.property(fc.array(arrival, { maxLength: 40 }), (arrivals) => {
        const q = new AdmissionQueue<null>();
        arrivals.forEach((a, i) => q.enqueue(String(i), null, cls(a.tier, a.flow), i, { queueMs: a.queueMs, maxQueued: 1000 }));
        const list = q.list();
        for (let i = 0; i + 1 < list.length; i++) expect(ranksBefore(list[i + 1]!, list[i]!)).toBe(false);
        for (const a of list) for (const b of list) if (a !== b) expect(ranksBefore(a, b)).toBe(!ranksBefore(b, a));
      }),
    );
  });

  it("tiers are strict and each key keeps its own arrival order; among keys always waiting, admissions alternate (property)", () => {
    fc.assert(
      fc.property(fc.array(fc.record({ tier: fc.constantFrom(...TIERS), flow: fc.constantFrom("A", "B", "C") }), { maxLength: 40 }), (arrivals) => {
        const q = new AdmissionQueue<null>();
        arrivals.forEach((a, i) => q.enqueue(String(i), null, cls(a.tier, a.flow), i, OPEN));
        const order = drain(q).map(Number);
        const tierOfI = (i: number) => TIERS.indexOf(arrivals[i]!.tier);
        for (let k = 0; k + 1 < order.length; k++) expect(tierOfI(order[k]!)).toBeLessThanOrEqual(tierOfI(order[k + 1]!));
        for (const tier of TIERS) {
          const served = order.filter((i) => arrivals[i]!.tier === tier);
          for (const flow of ["A", "B", "C"]) {
            const mine = served.filter((i) => arrivals[i]!.flow === flow);
            expect(mine).toEqual([...mine].sort((x, y) => x - y));
          }
          // all queued before any was served: within a tier, no key gets two turns while another with requests left gets none
          const left = new Map<string, number>();
          for (const i of served) left.set(arrivals[i]!.flow, (left.get(arrivals[i]!.flow) ?? 0) + 1);
          const turns = new Map<string, number>();
          for (const i of served) {
            const f = arrivals[i]!.flow;
            turns.set(f, (turns.get(f) ?? 0) + 1);
            left.set(f, left.get(f)! - 1);
            for (const [g, n] of left) if (n > 0) expect(turns.get(f)! - (turns.get(g) ?? 0)).toBeLessThanOrEqual(1);
          }
        }
      }),
    );
  });
});

describe("a full queue", () => {
  const FULL = { queueMs: 1e9, maxQueued: 2 };

  it("a higher tier pushes out the last waiter of a lower one (shed); the same tier is refused", () => {
    const q = new AdmissionQueue<null>();
    q.enqueue("d0", null, cls("default"), 0, FULL);
    q.enqueue("f0", null, cls("flex"), 1, FULL);
    const joined = q.enqueue("p0", null, cls("priority"), 2, FULL);
    expect(joined.ok && [joined.evicted?.waiter.ticket, joined.evicted?.reason]).toEqual(["f0", "shed"]);
    expect(q.enqueue("d1", null, cls("default"), 3, FULL)).toEqual({ ok: false, reason: "queue_full" });
    expect(drain(q)).toEqual(["p0", "d0"]);
  });

  it("a key under its share pushes out the last waiter of the key over it (fair_share_exceeded); the key over it is refused so", () => {
    const q = new AdmissionQueue<null>();
    const S = { queueMs: 1e9, maxQueued: 4 };
    for (let i = 0; i < 4; i++) q.enqueue(`a${i}`, null, cls("default", "A"), i, S);
    const joined = q.enqueue("b0", null, cls("default", "B"), 10, S);
    expect(joined.ok && [joined.evicted?.waiter.ticket, joined.evicted?.reason]).toEqual(["a3", "fair_share_exceeded"]);
    expect(q.enqueue("a4", null, cls("default", "A"), 11, S)).toEqual({ ok: false, reason: "fair_share_exceeded" });
    // a key with nothing queued that does not rank before the last waiter: the queue is full, not its share
    const level = new AdmissionQueue<null>();
    const T = { queueMs: 1_000, maxQueued: 2 };
    level.enqueue("a0", null, cls("default", "A"), 0, T);
    level.enqueue("b0", null, cls("default", "B"), 0, T);
    expect(level.enqueue("c0", null, cls("default", "C"), 5, T)).toEqual({ ok: false, reason: "queue_full" });
    // fair share off: the newcomer is simply refused
    const plain = new AdmissionQueue<null>();
    for (let i = 0; i < 4; i++) plain.enqueue(`a${i}`, null, cls("default", ""), i, { ...S, fairShare: "none" });
    expect(plain.enqueue("b0", null, cls("default", ""), 10, { ...S, fairShare: "none" })).toEqual({ ok: false, reason: "queue_full" });
  });

  it("never holds more than maxQueued, and every arrival is queued, refused or pushed out exactly once (property)", () => {
    fc.assert(
      fc.property(fc.array(fc.record({ tier: fc.constantFrom(...TIERS), flow: fc.constantFrom("A", "B") }), { maxLength: 30 }), fc.nat(6), (arrivals, max) => {
        const q = new AdmissionQueue<null>();
        const ended = new Map<string, number>();
        arrivals.forEach((a, i) => {
          const r = q.enqueue(String(i), null, cls(a.tier, a.flow), i, { queueMs: 1e9, maxQueued: max });
          if (!r.ok) ended.set(String(i), (ended.get(String(i)) ?? 0) + 1);
          else if (r.evicted) ended.set(r.evicted.waiter.ticket, (ended.get(r.evicted.waiter.ticket) ?? 0) + 1);
          expect(q.size).toBeLessThanOrEqual(max);
        });
        for (const t of drain(q)) ended.set(t, (ended.get(t) ?? 0) + 1);
        expect(ended.size).toBe(arrivals.length);
        expect([...ended.values()].every((n) => n === 1)).toBe(true);
      }),
    );
  });
});

const VIEW = clusterView([viewNode("p0", "prefill"), viewNode("d0", "decode")]);

describe("tiers and fair share at the edge (EdgeAdmission)", () => {
  const admitAll =
    (leases: LeaseTable, tried: string[]) =>
    (req: RouteRequest): RouteResponse => {
      tried.push(req.leaseId!);
      leases.take(req.leaseId!, { prefill: "p0", decode: "d0", tokens: 1, expiresAt: 1e12, route: "r", fallbacks: { prefill: [], decode: [] }, model: req.model });
      return { ok: true, leaseId: req.leaseId!, decision: decision("p0", "d0") };
    };

  it("a newcomer waits behind a waiting request of its model that ranks before it; not behind a lower tier, another model or when pinned", () => {
    const a = new EdgeAdmission();
    const S = { queueMs: 1_000, maxQueued: 10 };
    void a.wait(routeRequest({ model: "m" }), "w", 0, S, 1);
    expect(a.waitsBehind(routeRequest({ model: "m" }), 1, S)).toBe(true);
    expect(a.waitsBehind(routeRequest({ model: "n" }), 1, S)).toBe(false);
    expect(a.waitsBehind(routeRequest({ model: "m", pinned: true }), 1, S)).toBe(false);
    expect(a.waitsBehind(routeRequest({ model: "m", tier: "priority" }), 1, S)).toBe(false);
    expect(a.waitsBehind(routeRequest({ model: "m", tier: "flex" }), 1, S)).toBe(true);
    expect(new EdgeAdmission().waitsBehind(routeRequest({ model: "m" }), 1, S)).toBe(false);
  });

  it("admits priority before default before flex, and answers a shed or over-share waiter once", async () => {
    const a = new EdgeAdmission();
    const leases = new LeaseTable(60_000);
    const S = { queueMs: 1_000, maxQueued: 2 };
    const answers = new Map<string, RouteResponse[]>();
    const track = (id: string, p: Promise<RouteResponse>) => void p.then((r) => answers.set(id, [...(answers.get(id) ?? []), r]));
    track("flex", a.wait(routeRequest({ tier: "flex" }), "flex", 0, S, 3));
    track("default", a.wait(routeRequest(), "default", 1, S, 3));
    track("priority", a.wait(routeRequest({ tier: "priority" }), "priority", 2, S, 3));
    await new Promise((r) => setTimeout(r, 0));
    expect(answers.get("flex")).toEqual([{ ok: false, error: { kind: "cluster_busy", reason: "shed", retryAfterS: 3 } }]);
    const tried: string[] = [];
    a.offer(5, VIEW, leases, admitAll(leases, tried));
    expect(tried).toEqual(["priority", "default"]);
    a.offer(6, VIEW, leases, admitAll(leases, tried));
    await new Promise((r) => setTimeout(r, 0));
    expect([...answers.values()].every((list) => list.length === 1)).toBe(true);
    expect(a.status().rejected).toEqual([{ reason: "shed", tier: "flex", count: 1 }]);
    expect(a.status().queuedByTier).toEqual([
      { tier: "priority", count: 0 },
      { tier: "default", count: 0 },
      { tier: "flex", count: 0 },
    ]);
  });

  it("a key over its share of a full queue: 429 fair_share_exceeded", async () => {
    const a = new EdgeAdmission();
    const S = { queueMs: 1_000, maxQueued: 2 };
    void a.wait(routeRequest({ flow: "A" }), "a0", 0, S, 2);
    void a.wait(routeRequest({ flow: "B" }), "b0", 0, S, 2);
    expect(await a.wait(routeRequest({ flow: "A" }), "a1", 0, S, 2)).toEqual({ ok: false, error: { kind: "fair_share_exceeded", retryAfterS: 2 } });
  });

  it("flex with admission.ttftSloMs: refused at once when the predicted wait exceeds it; other tiers wait", async () => {
    const a = new EdgeAdmission();
    const S = { queueMs: 60_000, maxQueued: 10, ttftSloMs: 500 };
    // nothing ended yet: nothing to predict from, so nothing is shed
    const unknown = a.wait(routeRequest({ tier: "flex" }), "f0", 0, S, 1);
    expect(a.size).toBe(1);
    a.leave("f0");
    expect(await unknown).toEqual({ ok: false, error: { kind: "client_gone" } });
    // one lease ended in the last 2 s: one admission every 2 s, so about 2 s for the first in line
    a.released(8_000);
    expect(predictQueuedTtftMs(0, [8_000], 10_000)).toBe(2_000);
    expect(await a.wait(routeRequest({ tier: "flex" }), "f1", 10_000, S, 1)).toEqual({ ok: false, error: { kind: "slo_unmeetable", predictedMs: 2_000, retryAfterS: 2 } });
    void a.wait(routeRequest(), "d1", 10_000, S, 1);
    expect(a.size).toBe(1);
    expect(a.status().rejected).toEqual([{ reason: "slo_unmeetable", tier: "flex", count: 1 }]);
  });

  it("the wait estimate: no releases in the last minute, no estimate; more ahead, longer; measured over at least a second", () => {
    expect(predictQueuedTtftMs(3, [], 100_000)).toBeNull();
    expect(predictQueuedTtftMs(3, [1_000], 100_000)).toBeNull();
    expect(predictQueuedTtftMs(3, [99_990, 99_995], 100_000)).toBe(2_000);
    // 40 s is a minute old: two releases in the 30 s since the oldest kept
    expect(predictQueuedTtftMs(0, [40_000, 70_000, 100_000], 100_000)).toBe(15_000);
  });
});

describe("service tiers as written", () => {
  it("service_tier values, auto is default, the key's tier caps the request's", () => {
    expect(["auto", "default", "flex", "priority", "scale", null].map(tierOf)).toEqual(["default", "default", "flex", "priority", null, null]);
    expect(requestTier(null, null)).toBe("default");
    expect(requestTier("priority", null)).toBe("priority");
    expect(requestTier(null, "priority")).toBe("priority");
    expect(requestTier("priority", "default")).toBe("default");
    expect(requestTier("flex", "priority")).toBe("flex");
    expect(requestTier("default", "flex")).toBe("flex");
  });

  it("API_KEYS entries: key or key:tier; a colon that names no tier is part of the key", () => {
    expect(parseKeyEntry("key-abc:priority")).toEqual({ key: "key-abc", tier: "priority" });
    expect(parseKeyEntry("key-abc : flex")).toEqual({ key: "key-abc", tier: "flex" });
    expect(parseKeyEntry("key-abc:auto")).toEqual({ key: "key-abc", tier: "default" });
    expect(parseKeyEntry("sk:with:colons")).toEqual({ key: "sk:with:colons", tier: null });
    expect(parseKeyEntry("plain")).toEqual({ key: "plain", tier: null });
    expect(parseKeyEntry(":priority")).toEqual({ key: ":priority", tier: null });
  });

  it("vLLM's priority: lower is earlier, default stays vLLM's 0, a client's own value is replaced", () => {
    expect(TIERS.map(vllmPriorityOf)).toEqual([-1, 0, 1]);
    expect(JSON.parse(withPriority('{"model":"m","priority":-100}', 1))).toEqual({ model: "m", priority: 1 });
  });
});
