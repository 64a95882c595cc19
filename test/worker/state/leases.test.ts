import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { prefillContextFactor } from "../../../src/routing/predict";
import { DEFAULT_LEASE_TTL_MS, LeaseTable, leaseTtlMsOf, prefillCostOf, routedLease, type NodeLease } from "../../../src/state/leases";
import { decision, routeRequest } from "./fixtures";
import { withoutFileEngines } from "../helpers";

withoutFileEngines();

const lease = (fields: Partial<NodeLease> = {}): NodeLease => ({
  prefill: "p0",
  decode: "d0",
  tokens: 100,
  expiresAt: 1_000,
  route: "/v1/chat/completions",
  fallbacks: { prefill: [], decode: [] },
  model: "m",
  ...fields,
});

const NODES = ["n0", "n1", "n2"];

/** Takes, answers, moves and releases of leases r0..r5 over NODES; a take's prompt and prefill work up to `max` tokens. */
const leaseOps = (max: number) =>
  fc.oneof(
    fc.record({ kind: fc.constant("take" as const), id: fc.nat(5), p: fc.constantFrom(null, ...NODES), d: fc.constantFrom(...NODES), tokens: fc.nat(max), work: fc.nat(max) }),
    fc.record({ kind: fc.constant("answer" as const), id: fc.nat(5) }),
    fc.record({ kind: fc.constant("move" as const), id: fc.nat(5), role: fc.constantFrom("prefill" as const, "decode" as const), to: fc.constantFrom(...NODES) }),
    fc.record({ kind: fc.constant("release" as const), id: fc.nat(5) }),
  );
type LeaseOp = ReturnType<typeof leaseOps> extends fc.Arbitrary<infer T> ? T : never;

/** The ops on a fresh table (a take of a live id skipped, an answer only while P runs): the table and its live leases. */
function replay(ops: LeaseOp[]): { t: LeaseTable; live: NodeLease[] } {
  const t = new LeaseTable(1_000);
  for (const o of ops) {
    const id = `r${o.id}`;
    if (o.kind === "take") {
      if (!t.get(id)) t.take(id, lease({ prefill: o.p, decode: o.d, tokens: o.tokens, prefillTokens: Math.min(o.work, o.tokens) }));
    } else if (o.kind === "answer") {
      const p = t.get(id)?.prefill;
      if (p) t.endPrefill(id, p);
    } else if (o.kind === "move") t.move(id, o.role, o.to);
    else t.release(id);
  }
  const live = [...Array(6).keys()].map((i) => t.get(`r${i}`)).filter((l): l is NodeLease => l !== undefined);
  return { t, live };
}

describe("the lease table", () => {
  it("counts a lease on P while its leg runs and on D until it is released, once", () => {
    const t = new LeaseTable(1_000);
    t.take("a", lease());
    expect(t.loadOf("p0")).toMatchObject({ prefill: 1, requestsPrefill: 1 });
    expect(t.loadOf("d0")).toMatchObject({ decode: 1, tokens: 100, requestsDecode: 1 });
    expect(t.endPrefill("a", "p0")).toBe(true);
    expect(t.endPrefill("a", "p0")).toBe(false);
    expect(t.loadOf("p0")!.prefill).toBe(0);
    expect(t.release("a")?.decode).toBe("d0");
    expect(t.release("a")).toBeNull();
    expect(t.loadOf("d0")).toMatchObject({ decode: 0, tokens: 0, requestsDecode: 1 });
  });

  it("counts on D the leases whose P (another node) has not answered, through any takes, answers, moves and releases (property)", () => {
    fc.assert(
      fc.property(fc.array(leaseOps(1000), { maxLength: 40 }), (ops) => {
        const { t, live } = replay(ops);
        for (const n of NODES) {
          const awaiting = live.filter((l) => l.decode === n && l.prefill !== null && l.prefill !== n);
          expect(t.loadOf(n)?.awaiting ?? 0).toBe(awaiting.length);
          expect(t.loadOf(n)?.awaitingTokens ?? 0).toBe(awaiting.reduce((sum, l) => sum + l.tokens, 0));
        }
      }),
    );
  });

  it("counts on P the prompt tokens of the legs it runs for another node, until P answered (the KV it keeps for D), through any ops (property)", () => {
    fc.assert(
      fc.property(fc.array(leaseOps(1000), { maxLength: 40 }), (ops) => {
        const { t, live } = replay(ops);
        for (const n of NODES) {
          const held = live.filter((l) => l.prefill === n && l.decode !== n);
          expect(t.loadOf(n)?.prefillKvTokens ?? 0).toBe(held.reduce((sum, l) => sum + l.tokens, 0));
        }
      }),
    );
  });

  it("prices each prefill at its own context: a cold 80k-token prompt at ~5x its tokens, a 1k turn after 79k cached at ~9x its", () => {
    expect(prefillCostOf(lease({ tokens: 80_000, prefillTokens: 80_000 }))).toBeCloseTo(80_000 * prefillContextFactor(40_000));
    expect(prefillCostOf(lease({ tokens: 80_000, prefillTokens: 1_000 }))).toBeCloseTo(1_000 * prefillContextFactor(79_500));
    expect(prefillContextFactor(40_000)).toBeGreaterThan(4.9);
    const t = new LeaseTable(1_000);
    t.take("cold", lease({ prefill: "p0", tokens: 80_000, prefillTokens: 80_000 }));
    t.take("warm", lease({ prefill: "p0", tokens: 80_000, prefillTokens: 1_000 }));
    // the same 81,000 tokens a plain count would give, costed as they run
    expect(t.loadOf("p0")).toMatchObject({ prefillTokens: 81_000 });
    expect(t.loadOf("p0")!.prefillCost).toBeCloseTo(80_000 * prefillContextFactor(40_000) + 1_000 * prefillContextFactor(79_500));
    t.endPrefill("cold", "p0");
    expect(t.loadOf("p0")!.prefillCost).toBeCloseTo(1_000 * prefillContextFactor(79_500));
  });

  it("a node's prefill cost is the sum of its running prefills' through any takes, answers, moves and releases, 0 with none (property)", () => {
    fc.assert(
      fc.property(fc.array(leaseOps(100_000), { maxLength: 40 }), (ops) => {
        const { t, live } = replay(ops);
        for (const n of NODES) {
          const running = live.filter((l) => l.prefill === n);
          const cost = running.reduce((sum, l) => sum + prefillCostOf(l), 0);
          expect(t.loadOf(n)?.prefillCost ?? 0).toBeCloseTo(cost, 3);
          if (running.length === 0) expect(t.loadOf(n)?.prefillCost ?? 0).toBe(0);
        }
      }),
    );
  });

  it("moves a role on failover and expires what was not renewed", () => {
    const t = new LeaseTable(1_000);
    t.take("a", lease({ expiresAt: 1_000 }));
    expect(t.move("a", "decode", "d1")).toEqual({ from: "d0" });
    expect(t.loadOf("d1")).toMatchObject({ decode: 1, tokens: 100 });
    expect(t.loadOf("d0")).toMatchObject({ decode: 0, tokens: 0 });
    expect(t.renew("a", 500)).toBe(true);
    expect(t.expire(1_400)).toHaveLength(0);
    expect(t.expire(1_500).map(([id]) => id)).toEqual(["a"]);
    expect(t.size).toBe(0);
  });

  it("a lease released before it was taken leaves a tombstone, consumed once", () => {
    const t = new LeaseTable(1_000);
    t.tombstone("x", 0);
    expect(t.consumeTombstone("x")).toBe(true);
    expect(t.consumeTombstone("x")).toBe(false);
    t.tombstone("y", 0);
    t.expire(2_000);
    expect(t.consumeTombstone("y")).toBe(false);
  });
});

describe("a routed request's lease", () => {
  const req = routeRequest({ tokens: 50, promptChars: 1200, route: "/v1/chat/completions", requestId: "r1" });

  it("disaggregated: P holds the prefill work, D the prompt's KV tokens; the fallbacks are the lease's own copy", () => {
    const d = decision("p0", "d0", { fallbacks: { prefill: ["p1"], decode: ["d1"] } });
    const l = routedLease(req, d, false, 5_000, undefined);
    expect(l).toMatchObject({
      prefill: "p0",
      decode: "d0",
      tokens: 300,
      prefillTokens: 200,
      mode: "disaggregated",
      promptChars: 1200,
      expiresAt: 5_000,
      route: "/v1/chat/completions",
      requestId: "r1",
      model: "m",
    });
    expect(l).not.toHaveProperty("prediction");
    l.fallbacks.decode.shift();
    expect(d.decode.fallbacks).toEqual(["d1"]);
  });

  it("a local prefill holds D in both parts; colocated, no prefill part; an unknown prompt size counts the request's estimate", () => {
    const local = decision("d0", "d0", { mode: "local", prefillRule: "local_prefill" });
    expect(routedLease(req, local, false, 0, undefined).prefill).toBe("d0");
    expect(routedLease(req, decision("d0", "d0", { mode: "colocated" }), true, 0, undefined).prefill).toBeNull();
    const unknown = decision("p0", "d0", { tokens: { prompt: 0, uncachedOnDecode: null, prefillWork: 1, decodeWork: 1 } });
    expect(routedLease(routeRequest({ tokens: 77 }), unknown, false, 0, undefined)).toMatchObject({ tokens: 77, route: "other", promptChars: 0 });
  });

  it("keeps the prediction it was routed with", () => {
    const prediction = { node: "p0", role: "prefill" as const, hashes: ["h"], matched: 1, promptChars: 10, blockChars: 512 };
    expect(routedLease(req, decision("p0", "d0"), false, 0, prediction).prediction).toBe(prediction);
  });
});

describe("failover", () => {
  it("moves the role to the first fallback that may take work, dropping those ranked before it", () => {
    const t = new LeaseTable(1_000);
    t.take("a", lease({ fallbacks: { prefill: [], decode: ["d1", "d2", "d3"] } }));
    const moved = t.failover("a", "decode", (n) => n !== "d1");
    expect(moved).toMatchObject({ from: "d0", next: "d2" });
    expect(t.get("a")).toMatchObject({ decode: "d2", prefill: "p0", fallbacks: { decode: ["d3"] } });
    expect(t.loadOf("d0")).toMatchObject({ decode: 0, tokens: 0 });
    expect(t.loadOf("d2")).toMatchObject({ decode: 1, tokens: 100 });
  });

  it("a local prefill moves with its D: the next D prefills it", () => {
    const t = new LeaseTable(1_000);
    t.take("a", lease({ prefill: "d0", mode: "local", prefillTokens: 40, fallbacks: { prefill: [], decode: ["d1"] } }));
    t.failover("a", "decode", () => true);
    expect(t.get("a")).toMatchObject({ prefill: "d1", decode: "d1" });
    expect(t.loadOf("d1")).toMatchObject({ prefill: 1, prefillTokens: 40, decode: 1 });
    expect(t.loadOf("d0")).toMatchObject({ prefill: 0, decode: 0 });
  });

  it("nothing to move to: no lease, or no fallback that may take work", () => {
    const t = new LeaseTable(1_000);
    expect(t.failover("gone", "decode", () => true)).toBeNull();
    t.take("a", lease({ fallbacks: { prefill: ["p1"], decode: [] } }));
    expect(t.failover("a", "decode", () => true)).toBeNull();
    expect(t.failover("a", "prefill", () => false)).toBeNull();
    expect(t.get("a")).toMatchObject({ prefill: "p0", decode: "d0", fallbacks: { prefill: ["p1"] } });
  });
});

describe("sweeping expired leases", () => {
  it("looks at most once a second unless forced (an admitted reservation's end must not wait)", () => {
    const t = new LeaseTable(1_000);
    expect(t.sweepDue(5_000)).toBe(true);
    expect(t.sweepDue(5_999)).toBe(false);
    expect(t.sweepDue(5_999, true)).toBe(true);
    expect(t.sweepDue(6_500)).toBe(false);
    expect(t.sweepDue(6_999)).toBe(true);
  });

  it("an admitted lease lives only until its reservation ends unless renewed", () => {
    const t = new LeaseTable(60_000);
    t.take("a", lease({ expiresAt: 60_000 }));
    t.expireAt("a", 5_000);
    expect(t.expire(5_000).map(([id]) => id)).toEqual(["a"]);
  });
});

describe("the lease TTL", () => {
  it("LEASE_TTL_MS when a positive number, else the default", () => {
    expect(leaseTtlMsOf({ LEASE_TTL_MS: "1000" })).toBe(1_000);
    for (const env of [{}, undefined, { LEASE_TTL_MS: "0" }, { LEASE_TTL_MS: "soon" }]) expect(leaseTtlMsOf(env)).toBe(DEFAULT_LEASE_TTL_MS);
  });
});
