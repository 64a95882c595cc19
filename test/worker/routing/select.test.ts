import { describe, expect, it } from "vitest";
import fc from "fast-check";
import { loadBound } from "../../../src/routing/bounded-load";
import { rendezvousRank } from "../../../src/routing/rendezvous";
import { DECODE_KEY_DISCRIMINATOR, selectRoute } from "../../../src/routing/select";
import type { CandidateNode, PolicyName } from "../../../src/routing/types";
import { decided, node, selection, testKeys } from "./fixtures";
import { withoutFileEngines } from "../helpers";

withoutFileEngines();

const rank = (key: string, nodes: CandidateNode[]) => rendezvousRank(key, nodes).map((r) => r.node.id);
/** A key whose prefill rendezvous order over `nodes` starts with `first`. */
const keyFor = (nodes: CandidateNode[], first: string, discriminator = "") => testKeys(500).find((k) => rank(k + discriminator, nodes)[0] === first)!;

describe("round_robin", () => {
  it("cycles through healthy, non-draining nodes by id and returns the advanced cursor", () => {
    const prefill = [node("p2"), node("p0"), node("p1", { healthy: false }), node("p3", { drain: true })];
    const picks: string[] = [];
    let cursors = { prefill: 0, decode: 7 };
    for (let i = 0; i < 4; i++) {
      const d = decided(selectRoute(selection({ prefill, cursors, policy: { prefill: "round_robin" } })));
      picks.push(d.prefill.id);
      expect(d.prefill.rule).toBe("round_robin");
      cursors = d.cursors;
    }
    expect(picks).toEqual(["p0", "p2", "p0", "p2"]);
    expect(cursors).toEqual({ prefill: 4, decode: 7 }); // decode used affinity: its cursor stays
  });

  it("lists every candidate and falls back along the cycle", () => {
    const prefill = [node("a"), node("b"), node("c"), node("x", { healthy: false })];
    const d = decided(selectRoute(selection({ prefill, cursors: { prefill: 1, decode: 0 }, policy: { prefill: "round_robin" } })));
    expect(d.prefill.id).toBe("b");
    expect(d.prefill.candidates.map((c) => c.id)).toEqual(["b", "c", "a", "x"]);
    expect(d.prefill.candidates.find((c) => c.id === "x")?.skipped).toBe("unhealthy");
    expect(d.prefill.fallbacks).toEqual(["c", "a"]);
  });

  it("affinity without a key falls back to round robin (and advances the cursor)", () => {
    const d = decided(selectRoute(selection({ key: null, cursors: { prefill: 3, decode: 4 } })));
    expect(d.prefill.rule).toBe("round_robin");
    expect(d.decode.rule).toBe("round_robin");
    expect([d.prefill.id, d.decode.id]).toEqual(["p1", "d0"]);
    expect(d.cursors).toEqual({ prefill: 4, decode: 5 });
  });
});

describe("affinity", () => {
  const prefill = [node("p0"), node("p1"), node("p2")];
  const decode = [node("d0"), node("d1"), node("d2")];

  it("sends a key to its top rendezvous node, D ranked with the discriminator", () => {
    for (const key of testKeys(50)) {
      const d = decided(selectRoute(selection({ key, prefill, decode })));
      expect(d.prefill).toMatchObject({ id: rank(key, prefill)[0], rule: "affinity", failOpen: false });
      expect(d.decode).toMatchObject({ id: rank(key + DECODE_KEY_DISCRIMINATOR, decode)[0], rule: "affinity" });
      expect(d.prefill.candidates.map((c) => c.id)).toEqual(rank(key, prefill));
      expect(d.prefill.candidates.every((c) => c.rendezvous !== undefined && c.bound !== undefined)).toBe(true);
    }
  });

  it("spreads P and D independently", () => {
    const p2 = [node("p0"), node("p1")];
    const d2 = [node("d0"), node("d1")];
    let same = 0;
    const keys = testKeys(2000);
    for (const key of keys) {
      const d = decided(selectRoute(selection({ key, prefill: p2, decode: d2 })));
      if (d.prefill.id.slice(1) === d.decode.id.slice(1)) same++;
    }
    expect(same / keys.length).toBeGreaterThan(0.4);
    expect(same / keys.length).toBeLessThan(0.6);
  });

  it("skips unhealthy and draining nodes (rule affinity) and lists why", () => {
    const key = keyFor(prefill, "p0");
    const order = rank(key, prefill);
    const sick = prefill.map((n) => (n.id === order[0] ? { ...n, healthy: false } : n.id === order[1] ? { ...n, drain: true } : n));
    const d = decided(selectRoute(selection({ key, prefill: sick, decode })));
    expect(d.prefill).toMatchObject({ id: order[2], rule: "affinity", fallbacks: [] });
    expect(d.prefill.candidates.map((c) => c.skipped)).toEqual(["unhealthy", "draining", undefined]);
  });

  it("skips a node at its load bound (rule affinity_bounded_skip)", () => {
    const key = keyFor(prefill, "p0");
    const order = rank(key, prefill);
    // T = 4 in flight over weight 3: bound = ceil(1.25 * 5 / 3) = 3.
    const loaded = prefill.map((n) => ({ ...n, load: n.id === order[0] ? 3 : n.id === order[1] ? 1 : 0 }));
    const d = decided(selectRoute(selection({ key, prefill: loaded, decode })));
    expect(d.prefill).toMatchObject({ id: order[1], rule: "affinity_bounded_skip" });
    expect(d.prefill.candidates[0]).toMatchObject({ id: order[0], bound: 3, skipped: "over_bound" });
    expect(d.prefill.fallbacks).toEqual([order[2], order[0]]); // over-bound nodes last
  });

  it("never places a request beyond its bound while a node is under it (property)", () => {
    const scenario = fc.record({
      weights: fc.array(fc.constantFrom(1, 2, 3), { minLength: 1, maxLength: 6 }),
      loadFactor: fc.double({ min: 1, max: 2, noNaN: true }),
      steps: fc.array(fc.tuple(fc.string({ maxLength: 8 }), fc.boolean(), fc.nat()), { minLength: 1, maxLength: 80 }),
      down: fc.nat(),
      policy: fc.constantFrom<PolicyName>("affinity", "cache_aware"),
      slack: fc.constantFrom(0, 1, 4),
    });
    fc.assert(
      fc.property(scenario, ({ weights, loadFactor, steps, down, policy, slack }) => {
        const nodes = weights.map((w, i) => node(`n${i}`, { weight: w, healthy: weights.length === 1 || i !== down % weights.length }));
        for (const [key, release, which] of steps) {
          if (release) {
            const busy = nodes.filter((n) => n.load > 0);
            const n = busy[which % Math.max(1, busy.length)];
            if (n) n.load -= 1;
            continue;
          }
          const d = decided(
            selectRoute(
              selection({
                key,
                decode: nodes,
                // cache_aware has its own in-flight factor: give both policies the same one
                policy: {
                  decode: policy,
                  loadFactor,
                  loadSlack: slack,
                  cacheAware: { blockChars: 512, loadFactor, shareFactor: 1.1, shareHalfLife: 1000, maxBlocksPerRequest: 128 },
                },
                prefixBlockCount: 4,
              }),
            ),
          );
          const live = nodes.filter((n) => n.healthy && !n.drain);
          const T = live.reduce((s, n) => s + n.load, 0);
          const W = live.reduce((s, n) => s + n.weight, 0);
          const chosen = nodes.find((n) => n.id === d.decode.id)!;
          expect(chosen.healthy).toBe(true);
          expect(chosen.load).toBeLessThan(loadBound(chosen.weight, W, T, loadFactor, slack));
          chosen.load += 1;
        }
      }),
    );
  });
});

describe("least_load", () => {
  it("takes the lowest load per weight, rendezvous order breaking ties", () => {
    const decode = [node("d0", { load: 3 }), node("d1", { load: 4, weight: 2 }), node("d2", { load: 2 }), node("d3", { load: 1, healthy: false })];
    const d = decided(selectRoute(selection({ decode, policy: { decode: "least_load" } })));
    expect(d.decode).toMatchObject({ id: "d1", rule: "least_load" });
    const tied = [node("a", { load: 1 }), node("b", { load: 1 }), node("c", { load: 1 })];
    for (const key of testKeys(20)) {
      const t = decided(selectRoute(selection({ key, decode: tied, policy: { decode: "least_load" } })));
      expect(t.decode.id).toBe(rank(key + DECODE_KEY_DISCRIMINATOR, tied)[0]);
    }
  });

  it("breaks load ties by the smallest recent share first, so one shared key cannot pick the same nodes every time", () => {
    const idle = [node("a", { recent: 7 }), node("b", { recent: 2 }), node("c", { recent: 5 })];
    for (const key of testKeys(20)) {
      const t = decided(selectRoute(selection({ key, decode: idle, policy: { decode: "least_load" } })));
      expect(t.decode.id).toBe("b");
    }
  });
});

describe("cache_aware", () => {
  const decode = [node("d0"), node("d1"), node("d2")];
  const cache = (matches: Record<string, number>, fields: Parameters<typeof selection>[0] = {}) =>
    decided(
      selectRoute(
        selection({
          decode,
          prefixMatches: { prefill: {}, decode: matches },
          prefixBlockCount: 10,
          ...fields,
          policy: { decode: "cache_aware", ...fields.policy },
        }),
      ),
    ).decode;

  it("prefers the node holding the longest prefix and exposes the score terms", () => {
    const d = cache({ d0: 2, d1: 9, d2: 1 });
    expect(d).toMatchObject({ id: "d1", rule: "cache_aware" });
    expect(d.candidates[0]).toMatchObject({ id: "d1", matchedBlocks: 9, score: 0.9 });
    expect(d.candidates.map((c) => c.id)).toEqual(["d1", "d0", "d2"]);
  });

  it("keeps the longest match while the node is under its in-flight and share bounds", () => {
    // in-flight bound: ceil(3 * (6+1) / 3) = 7; share bound: 1.1 * (30+1) / 3 + 1 = 12.37
    const busy = [node("d0", { load: 1, recent: 10 }), node("d1", { load: 4, recent: 12 }), node("d2", { load: 1, recent: 8 })];
    const d = cache({ d0: 8, d1: 9 }, { decode: busy });
    expect(d.id).toBe("d1");
    expect(d.candidates[0]).toMatchObject({ id: "d1", matchedBlocks: 9, recent: 12, shareBound: 12.367 });
  });

  it("treats the in-flight bound as a hard limit", () => {
    const loaded = [node("d0"), node("d1", { load: 3 }), node("d2")]; // bound ceil(1.25*4/3) = 2
    const d = cache({ d1: 10 }, { decode: loaded, policy: { cacheAware: { blockChars: 512, loadFactor: 1.25, shareFactor: 1.1, shareHalfLife: 1000, maxBlocksPerRequest: 128 } } });
    expect(d.id).not.toBe("d1");
    expect(d.candidates.find((c) => c.id === "d1")?.skipped).toBe("over_bound");
  });

  it("treats the share bound as a hard limit, so requests per node stay even", () => {
    // d1 took 13 of the last 31 requests: over 1.1 * 32 / 3 + 1 = 12.73 (one request over its share is allowed)
    const skewed = [node("d0", { recent: 9 }), node("d1", { recent: 13 }), node("d2", { recent: 9 })];
    const d = cache({ d1: 10, d0: 3 }, { decode: skewed });
    expect(d.id).toBe("d0");
    expect(d.candidates.find((c) => c.id === "d1")?.skipped).toBe("over_share");
  });

  it("under predicted disaggregation a warm node over its share is still an option: the prediction prices its queue, and takes it over a cold one", () => {
    // work recently routed, in tokens: d1 took 30k of the last 48k, over 1.1 x its third and a request's slack
    const skewed = [node("d0", { recent: 9000, localPrefill: true }), node("d1", { recent: 30_000, localPrefill: true }), node("d2", { recent: 9000, localPrefill: true })];
    const fields = { decode: skewed, promptChars: 10 * 512, policy: { prefill: "cache_aware", decode: "cache_aware", disaggregation: "predicted" } } as const;
    // d1 holds the whole prompt and is over its share: the policy's pick is d0, and d1 alone is far faster
    const both = decided(selectRoute(selection({ ...fields, prefixMatches: { prefill: {}, decode: { d1: 10, d0: 3 } }, prefixBlockCount: 10 })));
    expect(both.decode.candidates.find((c) => c.id === "d1")?.skipped).toBe("over_share");
    expect(both).toMatchObject({ mode: "local", reason: "predicted", decode: { id: "d1", rule: "predicted" } });
    // over the in-flight bound (cache_aware's: 3 x 21 / 4 in flight), it is not
    const loaded = [...skewed.map((n) => (n.id === "d1" ? { ...n, load: 20 } : n)), node("d3", { recent: 9000, localPrefill: true })];
    const bounded = decided(selectRoute(selection({ ...fields, decode: loaded, prefixMatches: { prefill: {}, decode: { d1: 10, d0: 3 } }, prefixBlockCount: 10 })));
    expect(bounded.decode.id).not.toBe("d1");
  });

  it("sends a request whose prefix nobody holds to the node with the smallest recent share", () => {
    const d = cache({ d0: 1, d1: 1, d2: 1 }, { decode: [node("d0", { recent: 5 }), node("d1", { recent: 3 }), node("d2", { recent: 4 })] });
    expect(d.id).toBe("d1");
  });

  it("never picks a node over either bound when one under both exists (property)", () => {
    fc.assert(
      fc.property(fc.array(fc.record({ load: fc.nat(6), recent: fc.nat(40), matched: fc.nat(10) }), { minLength: 2, maxLength: 6 }), (specs) => {
        const pool = specs.map((s, i) => node(`d${i}`, { load: s.load, recent: s.recent }));
        const matches = Object.fromEntries(specs.map((s, i) => [`d${i}`, s.matched]));
        const d = cache(matches, { decode: pool });
        const chosen = d.candidates.find((c) => c.id === d.id)!;
        // a candidate's recent work and share bound are shown rounded to 3 decimals (round3), the
        // decision uses them exact: within half a unit of the last place the two cannot be told
        // apart ("34 < 34" once), so a node counts as under its share only by more than that
        const HALF_UNIT = 5e-4;
        const clearlyUnder = (c: (typeof d.candidates)[number]) => c.load < c.bound! && c.recent! < c.shareBound! - HALF_UNIT;
        if (d.candidates.some(clearlyUnder)) {
          expect(chosen.load).toBeLessThan(chosen.bound!);
          expect(chosen.recent!).toBeLessThan(chosen.shareBound! + HALF_UNIT);
          // and no feasible node holds a longer prefix
          const better = d.candidates.filter((c) => clearlyUnder(c) && c.matchedBlocks! > chosen.matchedBlocks!);
          expect(better).toEqual([]);
        }
      }),
    );
  });

  it("spreads new conversations evenly when nothing (or only a shared system prompt) matches", () => {
    for (const matches of [{}, { d0: 1, d1: 1, d2: 1 }] as Array<Record<string, number>>) {
      const counts = new Map<string, number>();
      for (const key of testKeys(3000)) {
        const d = cache(matches, { key });
        expect(Number.isFinite(d.candidates[0]!.score)).toBe(true);
        counts.set(d.id, (counts.get(d.id) ?? 0) + 1);
      }
      for (const id of ["d0", "d1", "d2"]) expect(Math.abs((counts.get(id) ?? 0) - 1000)).toBeLessThan(150);
    }
  });

  it("has finite scores with no blocks and nothing in flight", () => {
    const d = cache({}, { prefixBlockCount: 0 });
    expect(d.candidates.every((c) => c.score === 0 && c.matchedBlocks === 0)).toBe(true);
  });
});

describe("session stickiness", () => {
  const prefill = [node("p0"), node("p1"), node("p2")];
  const key = keyFor(prefill, "p0");
  const other = rank(key, prefill)[2]!;

  it.each<PolicyName>(["affinity", "cache_aware"])("%s keeps the conversation's previous node, even draining", (policy) => {
    const draining = prefill.map((n) => (n.id === other ? { ...n, drain: true } : n));
    const d = decided(selectRoute(selection({ key, prefill: draining, sticky: { prefill: other }, policy: { prefill: policy } })));
    expect(d.prefill).toMatchObject({ id: other, rule: "sticky" });
    expect(d.prefill.candidates).toHaveLength(3);
  });

  it("lets go of an unhealthy or overloaded sticky node", () => {
    const sick = prefill.map((n) => (n.id === other ? { ...n, healthy: false } : n));
    expect(decided(selectRoute(selection({ key, prefill: sick, sticky: { prefill: other } }))).prefill.rule).toBe("affinity");
    const busy = prefill.map((n) => (n.id === other ? { ...n, load: 5 } : n));
    const d = decided(selectRoute(selection({ key, prefill: busy, sticky: { prefill: other } })));
    expect(d.prefill.id).not.toBe(other);
    expect(d.prefill.rule).not.toBe("sticky");
  });

  it("does not apply to round_robin or least_load", () => {
    const d = decided(selectRoute(selection({ key, prefill, sticky: { prefill: other }, policy: { prefill: "least_load" } })));
    expect(d.prefill.rule).toBe("least_load");
  });
});

describe("fail open", () => {
  it("takes the least recently failed node when none is healthy", () => {
    const prefill = [node("p0", { healthy: false, lastFailureAt: 300 }), node("p1", { healthy: false, lastFailureAt: 100 }), node("p2", { healthy: false, lastFailureAt: 200 })];
    const d = decided(selectRoute(selection({ prefill })));
    expect(d.prefill).toMatchObject({ id: "p1", rule: "fail_open", failOpen: true, fallbacks: ["p2", "p0"] });
    expect(d.decode.failOpen).toBe(false);
  });

  it("uses draining nodes before refusing when every healthy node drains", () => {
    const prefill = [node("p0", { healthy: false }), node("p1", { drain: true, lastFailureAt: 5 }), node("p2", { drain: true })];
    const d = decided(selectRoute(selection({ prefill })));
    expect(d.prefill).toMatchObject({ id: "p2", rule: "fail_open", failOpen: true, fallbacks: ["p1"] });
  });

  it("errors only on an empty pool", () => {
    expect(selectRoute(selection({ prefill: [] }))).toEqual({ ok: false, error: { kind: "no_nodes", role: "prefill" } });
    expect(selectRoute(selection({ decode: [] }))).toEqual({ ok: false, error: { kind: "no_nodes", role: "decode" } });
  });
});

describe("colocated", () => {
  it("uses only the decode pool and serves both legs from its pick", () => {
    const d = decided(selectRoute(selection({ colocated: true, prefill: [], key: "abc" })));
    expect(d.prefill).toMatchObject({ id: d.decode.id, rule: "colocated", candidates: [] });
    expect(d.decode.rule).toBe("affinity");
    expect(selectRoute(selection({ colocated: true, decode: [] }))).toMatchObject({ ok: false, error: { kind: "no_nodes", role: "decode" } });
  });
});

describe("pdGroup", () => {
  const prefill = [node("pa", { group: "A" }), node("pb", { group: "B" })];
  const decode = [node("da1", { group: "A" }), node("da2", { group: "A" }), node("db1", { group: "B" }), node("db2", { group: "B" })];
  /** A key whose P is pa and whose best D overall is in group B. */
  const crossKey = testKeys(2000).find((k) => rank(k, prefill)[0] === "pa" && rank(k + DECODE_KEY_DISCRIMINATOR, decode)[0]!.startsWith("db"))!;
  const route = (mode: "off" | "prefer" | "strict", fields: Parameters<typeof selection>[0] = {}) =>
    selectRoute(selection({ key: crossKey, prefill, decode, ...fields, policy: { pdGroup: mode, loadFactor: 10, ...fields.policy } }));

  it("off ignores groups", () => {
    const d = decided(route("off"));
    expect(d.prefill.id).toBe("pa");
    expect(d.decode.id.startsWith("db")).toBe(true);
  });

  it("prefer takes the best D in P's group when its load is within the bonus", () => {
    const d = decided(route("prefer"));
    expect(d.decode).toMatchObject({ rule: "pdgroup_prefer" });
    expect(d.decode.id.startsWith("da")).toBe(true);
    expect(d.decode.fallbacks.slice(0, 1).every((id) => id.startsWith("da"))).toBe(true);
  });

  it("prefer keeps an idle cluster in P's group whatever the weights (load per unit of weight)", () => {
    // The best D overall is a weight-3 node in group B; P's group has idle weight-1 nodes.
    const heavyB = decode.map((n) => (n.group === "B" ? { ...n, weight: 3 } : n));
    const d = decided(route("prefer", { decode: heavyB }));
    expect(d.decode.rule).toBe("pdgroup_prefer");
    expect(d.decode.id.startsWith("da")).toBe(true);
    // 1 request per unit of weight in group A against 2/3 in B: 1 <= 0.67 * 1.3 fails, B wins.
    const busier = heavyB.map((n) => (n.group === "A" ? { ...n, load: 1 } : { ...n, load: 2 }));
    expect(decided(route("prefer", { decode: busier })).decode.id.startsWith("db")).toBe(true);
    // 1 <= 1 * 1.3 holds: A again.
    const even = heavyB.map((n) => (n.group === "A" ? { ...n, load: 1 } : { ...n, load: 3 }));
    expect(decided(route("prefer", { decode: even })).decode.id.startsWith("da")).toBe(true);
  });

  it("prefer keeps the best D overall when the group's D is too busy", () => {
    const busyA = decode.map((n) => (n.group === "A" ? { ...n, load: 3 } : { ...n, load: 2 }));
    // 3 per unit of weight > 2 * 1.3: the best D (group B) wins.
    const d = decided(route("prefer", { decode: busyA }));
    expect(d.decode.rule).toBe("affinity");
    expect(d.decode.id.startsWith("db")).toBe(true);
    // A bigger bonus accepts it (3 <= 2 * 1.5).
    expect(decided(route("prefer", { decode: busyA, policy: { pdGroupBonus: 0.5 } })).decode.rule).toBe("pdgroup_prefer");
    // Against an idle best D, any load in the group is too much.
    const idleB = decode.map((n) => (n.group === "A" ? { ...n, load: 1 } : n));
    expect(decided(route("prefer", { decode: idleB, policy: { pdGroupBonus: 2 } })).decode.rule).toBe("affinity");
  });

  it("strict picks D inside P's group", () => {
    const d = decided(route("strict"));
    expect(d.prefill.id).toBe("pa");
    expect(d.decode.rule).toBe("pdgroup_strict");
    expect(d.decode.id.startsWith("da")).toBe(true);
    expect(d.decode.fallbacks.every((id) => id.startsWith("da"))).toBe(true);
    expect(d.decode.candidates.filter((c) => c.id.startsWith("db")).every((c) => c.skipped === "group")).toBe(true);
  });

  it("strict walks P's ranking to a P whose group has an available D", () => {
    const noA = decode.map((n) => (n.group === "A" ? { ...n, healthy: false } : n));
    const d = decided(route("strict", { decode: noA }));
    expect(d.prefill).toMatchObject({ id: "pb", rule: "pdgroup_strict", fallbacks: [] });
    expect(d.prefill.candidates.find((c) => c.id === "pa")?.skipped).toBe("group");
    expect(d.decode.id.startsWith("db")).toBe(true);
  });

  it("strict answers an error naming the groups when no P's group has a D", () => {
    const result = route("strict", { decode: [node("dc", { group: "C" })] });
    expect(result.ok).toBe(false);
    if (result.ok) return;
    expect(result.error.kind).toBe("no_decode_in_group");
    if (result.error.kind !== "no_decode_in_group") return;
    expect(result.error.message).toContain("A, B");
    expect(result.error.message).toContain("C");
  });

  it("prefer and strict hold over many keys: strict never crosses groups, prefer mostly stays", () => {
    let preferSame = 0;
    for (const key of testKeys(300)) {
      const strict = decided(route("strict", { key }));
      const prefer = decided(route("prefer", { key }));
      const group = (id: string) => (id.includes("a") ? "A" : "B");
      expect(group(strict.decode.id)).toBe(group(strict.prefill.id));
      if (group(prefer.decode.id) === group(prefer.prefill.id)) preferSame++;
    }
    expect(preferSame).toBe(300); // all idle: the in-group D is always within the bonus
  });
});

describe("every decision", () => {
  const pools = fc
    .array(
      fc.record({
        load: fc.nat(6),
        healthy: fc.boolean(),
        drain: fc.boolean(),
        weight: fc.constantFrom(1, 2),
        group: fc.constantFrom("A", "B"),
        lastFailureAt: fc.nat(1000),
      }),
      { minLength: 1, maxLength: 5 },
    )
    .map((rows) => rows.map((r, i) => node(`n${i}`, r)));
  const policies = fc.constantFrom<PolicyName>("round_robin", "affinity", "cache_aware", "least_load");

  it("lists all candidates once, excludes the pick from its fallbacks, and is deterministic", () => {
    fc.assert(
      fc.property(
        pools,
        pools,
        policies,
        policies,
        fc.constantFrom("off", "prefer", "strict" as const),
        fc.option(fc.string(), { nil: null }),
        fc.boolean(),
        fc.option(fc.record({ prefill: fc.constantFrom("pn0", "pn1"), decode: fc.constantFrom("n0", "n2") }), { nil: null }),
        (prefill, decode, p, d, pdGroup, key, colocated, sticky) => {
          const input = selection({
            prefill: prefill.map((n) => ({ ...n, id: `p${n.id}` })),
            decode,
            key,
            colocated,
            sticky,
            prefixMatches: { prefill: {}, decode: { n0: 2 } },
            prefixBlockCount: 3,
            policy: { prefill: p, decode: d, pdGroup },
          });
          const result = selectRoute(input);
          expect(selectRoute(input)).toEqual(result);
          if (!result.ok) {
            expect(pdGroup).toBe("strict");
            return;
          }
          const roles = colocated ? (["decode"] as const) : (["prefill", "decode"] as const);
          for (const role of roles) {
            const r = result.value[role];
            expect(r.candidates.map((c) => c.id).sort()).toEqual(input[role].map((n) => n.id).sort());
            expect(r.fallbacks).not.toContain(r.id);
            expect(new Set(r.fallbacks).size).toBe(r.fallbacks.length);
            const pick = input[role].find((n) => n.id === r.id)!;
            if (!r.failOpen) expect(pick.healthy).toBe(true);
            if (input[role].some((n) => n.healthy && !n.drain) && r.rule !== "sticky" && !(pdGroup === "strict" && r.failOpen)) {
              expect(pick.drain).toBe(false);
            }
          }
        },
      ),
      { numRuns: 300 },
    );
  });
});
