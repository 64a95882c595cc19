import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { isBusy, KV_QUIET, kvBarrier } from "../../../src/routing/kv-guard";
import { selectRoute } from "../../../src/routing/select";
import type { CandidateNode, GuardSettings, PdGroupMode, PolicyName } from "../../../src/routing/types";
import { decided, node, selection } from "./fixtures";
import { withoutFileEngines } from "../helpers";

withoutFileEngines();

// The decode KV guard in the pure selection core (SPEC 8): busy decode nodes are not picked while
// another can serve; KV use weighs in as k/(1-k) extra requests; no fresh signals, never busy.

const GUARD: GuardSettings = { kvBusy: 0.9, queueBusy: 8 };
const POLICIES: PolicyName[] = ["round_robin", "affinity", "cache_aware", "least_load"];
const signals = (kvUsage: number | null, queue: number | null = 0) => ({ kvUsage, queue, ageMs: 100 });

const arbSignals = fc.option(
  fc.record({ kvUsage: fc.option(fc.double({ min: 0, max: 1, noNaN: true }), { nil: null }), queue: fc.option(fc.nat(20), { nil: null }), ageMs: fc.nat(20000) }),
  { nil: null },
);
const arbDecode = fc
  .array(
    fc.record({
      load: fc.nat(30),
      weight: fc.constantFrom(1, 2, 0.5),
      healthy: fc.boolean(),
      drain: fc.boolean(),
      group: fc.constantFrom("a", "b"),
      signals: arbSignals,
      recent: fc.nat(50),
    }),
    { minLength: 1, maxLength: 6 },
  )
  .map((specs) => specs.map((s, i) => node(`d${i}`, s)));

const input = (decode: CandidateNode[], policy: PolicyName, pdGroup: PdGroupMode = "off", extra = {}) =>
  selection({
    decode,
    prefill: [node("p0", { group: "a" }), node("p1", { group: "b" })],
    policy: { prefill: "round_robin", decode: policy, pdGroup, loadSlack: 4 },
    guard: GUARD,
    key: "conversation",
    ...extra,
  });

describe("busy", () => {
  it("at or past kvBusy or queueBusy; never without fresh signals", () => {
    expect(isBusy(node("d", { signals: signals(0.9) }), GUARD)).toBe(true);
    expect(isBusy(node("d", { signals: signals(0.899) }), GUARD)).toBe(false);
    expect(isBusy(node("d", { signals: signals(0.1, 8) }), GUARD)).toBe(true);
    expect(isBusy(node("d", { signals: signals(null, null) }), GUARD)).toBe(false);
    expect(isBusy(node("d", { signals: null }), GUARD)).toBe(false);
    expect(isBusy(node("d"), GUARD)).toBe(false);
  });

  it("under predicted (pricesPrefills) the queue test leaves out the prefill legs the router runs on the node; otherwise they count", () => {
    const both = { signals: signals(0.1, 8), prefillRequests: 6 };
    expect(isBusy(both, GUARD)).toBe(true);
    expect(isBusy(both, { ...GUARD, pricesPrefills: true })).toBe(false);
    expect(isBusy({ ...both, prefillRequests: 0 }, { ...GUARD, pricesPrefills: true })).toBe(true);
    // never below an empty queue, and KV is judged whatever the prefills
    expect(isBusy({ signals: signals(0.95, 2), prefillRequests: 6 }, { ...GUARD, pricesPrefills: true })).toBe(true);
  });

  it("the barrier is k/(1-k): 0 empty, 1 half full, 9 at 0.9, unbounded at full", () => {
    expect(kvBarrier(node("d"))).toBe(0);
    expect(kvBarrier(node("d", { signals: signals(0.5) }))).toBeCloseTo(1);
    // a quiet node (below KV_QUIET) carries none: readings that caught a request mid-flight do not order idle nodes
    expect(kvBarrier(node("d", { signals: signals(0.001) }))).toBe(0);
    expect(kvBarrier(node("d", { signals: signals(KV_QUIET - 1e-9) }))).toBe(0);
    expect(kvBarrier(node("d", { signals: signals(KV_QUIET) }))).toBeCloseTo(KV_QUIET / (1 - KV_QUIET));
    expect(kvBarrier(node("d", { signals: signals(0.9) }))).toBeCloseTo(9);
    expect(kvBarrier(node("d", { signals: signals(1) }))).toBe(Number.POSITIVE_INFINITY);
    fc.assert(
      fc.property(fc.double({ min: 0, max: 0.999, noNaN: true }), fc.double({ min: 0, max: 0.999, noNaN: true }), (a, b) => {
        const [lo, hi] = a <= b ? [a, b] : [b, a];
        return kvBarrier(node("x", { signals: signals(lo) })) <= kvBarrier(node("y", { signals: signals(hi) }));
      }),
    );
  });
});

describe("the guard in selection (properties)", () => {
  it("never picks a busy decode node while a non-busy available one exists; waits only when every available one is busy", () => {
    fc.assert(
      fc.property(arbDecode, fc.constantFrom(...POLICIES), fc.constantFrom<PdGroupMode>("off", "prefer", "strict"), fc.nat(10), (decode, policy, pdGroup, cursor) => {
        const result = selectRoute(input(decode, policy, pdGroup, { cursors: { prefill: 0, decode: cursor } }));
        const available = decode.filter((n) => n.healthy && !n.drain);
        const free = available.filter((n) => !isBusy(n, GUARD));
        if (!result.ok) {
          if (result.error.kind === "decode_busy") {
            // it waits only when nothing free could serve (strict: nothing free in the groups it tried)
            if (pdGroup !== "strict") expect(free).toHaveLength(0);
            expect(result.error.candidates.length).toBe(decode.length);
          }
          return;
        }
        const picked = decode.find((n) => n.id === result.value.decode.id)!;
        if (result.value.decode.failOpen) {
          expect(available).toHaveLength(0);
          return;
        }
        expect(isBusy(picked, GUARD)).toBe(false);
        for (const c of result.value.decode.candidates) {
          const n = decode.find((x) => x.id === c.id)!;
          expect(c.busy).toBe(isBusy(n, GUARD));
          expect(c.kvUsage).toBe(n.signals?.kvUsage ?? null);
          expect(c.signalsAgeMs).toBe(n.signals ? n.signals.ageMs : null);
        }
      }),
      { numRuns: 400 },
    );
  });

  it("fails open: decode nodes without signals decide exactly as with no guard at all", () => {
    fc.assert(
      fc.property(arbDecode, fc.constantFrom(...POLICIES), (decode, policy) => {
        const blind = decode.map((n) => ({ ...n, signals: null }));
        const guarded = selectRoute(input(blind, policy));
        const unguarded = selectRoute({ ...input(blind, policy), guard: null });
        expect(guarded.ok && guarded.value.decode.id).toBe(unguarded.ok && unguarded.value.decode.id);
      }),
      { numRuns: 300 },
    );
  });

  it("affinity keeps its node until its load plus the barrier reaches its bound", () => {
    const decode = (kv0: number, load0: number) => [node("d0", { signals: signals(kv0), load: load0 }), node("d1", { signals: signals(0) })];
    const favourite = decided(selectRoute(input(decode(0, 0), "affinity"))).decode.id;
    const other = favourite === "d0" ? "d1" : "d0";
    const at = (kvFav: number, loadFav: number) => {
      const nodes = [node(favourite, { signals: signals(kvFav), load: loadFav }), node(other, { signals: signals(0) })];
      return decided(selectRoute(input(nodes, "affinity"))).decode.id;
    };
    // bound = ceil(1.25 * (T + 1) / 2) + 4 over T = both nodes' load plus barriers (loadSlack 4)
    expect(at(0.85, 0)).toBe(favourite); // 0 + 5.67 < bound ceil(4.17) + 4 = 9
    expect(at(0.85, 8)).toBe(favourite); // 8 + 5.67 = 13.67 < bound ceil(9.17) + 4 = 14
    expect(at(0.85, 9)).toBe(other); // 9 + 5.67 = 14.67 >= bound ceil(9.79) + 4 = 14
    expect(at(0, 9)).toBe(favourite); // the same load without KV pressure stays: 9 < ceil(6.25) + 4 = 11
  });

  it("least_load weighs KV use with the load: a fuller cache loses a tie it would have won by name", () => {
    const d = decided(selectRoute(input([node("d0", { signals: signals(0.6), load: 1 }), node("d1", { signals: signals(0.1), load: 2 })], "least_load")));
    // d0: 1 + 1.5 = 2.5; d1: 2 + 0.11 = 2.11
    expect(d.decode.id).toBe("d1");
  });

  it("a pinned request keeps its node even when it is busy (it holds state the request needs)", () => {
    const decode = [node("d0", { signals: signals(0.99) }), node("d1", { signals: signals(0) })];
    const d = decided(selectRoute(input(decode, "affinity", "off", { sticky: { prefill: "p0", decode: "d0" }, pinned: true })));
    expect(d.decode.id).toBe("d0");
    const unpinned = decided(selectRoute(input(decode, "affinity", "off", { sticky: { prefill: "p0", decode: "d0" } })));
    expect(unpinned.decode.id).toBe("d1");
  });
});
