import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { DECODE_KEY_DISCRIMINATOR, selectRoute } from "../../../src/routing/select";
import { rendezvousRank } from "../../../src/routing/rendezvous";
import type { CandidateNode, PolicyName } from "../../../src/routing/types";
import { decided, node, selection, testKeys, type InputFields } from "./fixtures";
import { withoutFileEngines } from "../helpers";

withoutFileEngines();

// Conditional disaggregation in the selection core (SPEC 8): D first, then D alone or a P.

const BLOCK = 512;
/** a 20-block prompt (20 x 512 characters = 2,560 tokens at 4 characters a token) */
const PROMPT_CHARS = 20 * BLOCK;
const guard = { kvBusy: 0.9, queueBusy: 8 };
const vllmD = (id: string, fields: Partial<CandidateNode> = {}) => node(id, { localPrefill: true, ...fields });
const conditional = (fields: InputFields = {}) =>
  selectRoute(
    selection({
      prefill: [node("p0"), node("p1")],
      decode: [vllmD("d0"), vllmD("d1")],
      promptChars: PROMPT_CHARS,
      prefixBlockCount: 20,
      guard,
      ...fields,
      policy: { disaggregation: "conditional", localPrefillTokens: 2048, localPrefillRatio: 0.7, ...fields.policy },
    }),
  );
/** the D a key lands on under affinity (no load) */
const dOf = (key: string, ids = ["d0", "d1"]) =>
  rendezvousRank(
    key + DECODE_KEY_DISCRIMINATOR,
    ids.map((id) => vllmD(id)),
  )[0]!.node.id;
const pOf = (key: string, nodes: CandidateNode[]) => rendezvousRank(key, nodes)[0]!.node.id;

describe("decode first: D alone when it holds most of the prompt", () => {
  it("a warm turn (18 of 20 blocks held on D): local, no P, the reason is cached; should D fail, the P/D path is its fallback", () => {
    const d = dOf("k");
    const r = decided(conditional({ prefixMatches: { prefill: {}, decode: { [d]: 18 } } }));
    expect(r).toMatchObject({ mode: "local", reason: "cached" });
    expect(r.decode.id).toBe(d);
    expect(r.prefill).toMatchObject({ id: d, rule: "local_prefill" });
    // issue 25 item 5: the Ps the request goes through if D fails (never D itself)
    expect(r.prefill.fallbacks.length).toBeGreaterThan(0);
    for (const p of r.prefill.fallbacks) expect(p.startsWith("p")).toBe(true);
    // 2 blocks of 512 characters at 4 a token
    expect(r.tokens).toMatchObject({ prompt: 2560, uncachedOnDecode: 256, prefillWork: 256, decodeWork: 256 });
  });

  it("a cold long prompt: a P prefills it, the reason is cold", () => {
    const r = decided(conditional({ prefixMatches: { prefill: {}, decode: {} } }));
    expect(r).toMatchObject({ mode: "disaggregated", reason: "cold" });
    expect(r.prefill.id.startsWith("p")).toBe(true);
    expect(r.tokens.uncachedOnDecode).toBe(2560);
  });

  it("a node without localPrefill (SGLang decode mode) never prefills alone: no_local_prefill", () => {
    const decode = [node("d0", { localPrefill: false }), node("d1", { localPrefill: false })];
    const r = decided(conditional({ decode, prefixMatches: { prefill: {}, decode: { d0: 20, d1: 20 } } }));
    expect(r).toMatchObject({ mode: "disaggregated", reason: "no_local_prefill" });
  });

  it("a D that this request's tokens would take to kvBusy is busy for it: with every D so the request waits; with room on one, it goes there", () => {
    const d = dOf("k");
    // 0.85 + 2,560 prompt tokens / 4,096 >= 0.9: D holds the whole prompt, local or pulled
    const decode = [vllmD("d0"), vllmD("d1")].map((n) => ({ ...n, signals: { kvUsage: 0.85, queue: 0, ageMs: 10, kvCapacityTokens: 4096 } }));
    const r = conditional({ decode, prefixMatches: { prefill: {}, decode: { [d]: 18 } } });
    expect(r.ok).toBe(false);
    expect(!r.ok && r.error.kind).toBe("decode_busy");
    // with room for it on D, local again
    const roomy = decode.map((n) => (n.id === d ? { ...n, signals: { kvUsage: 0.2, queue: 0, ageMs: 10, kvCapacityTokens: 4096 } } : n));
    expect(decided(conditional({ decode: roomy, prefixMatches: { prefill: {}, decode: { [d]: 18 } } }))).toMatchObject({ mode: "local", decode: { id: d } });
  });

  it("a cold prompt whose P would queue it (engine queue at queueBusy): D prefills it, prefill_busy; P is shown busy", () => {
    const prefill = [node("p0", { signals: { kvUsage: 0.2, queue: 9, ageMs: 10 } })];
    const r = decided(conditional({ prefill }));
    expect(r).toMatchObject({ mode: "local", reason: "prefill_busy" });
    expect(r.prefill.rule).toBe("local_prefill");
    expect(r.prefill.candidates.find((c) => c.id === "p0")).toMatchObject({ queue: 9, busy: true });
    // the P cursor did not move: no P leg
    expect(r.cursors.prefill).toBe(0);
  });

  it("a pinned turn (previous_response_id) is served by its D alone", () => {
    const r = decided(conditional({ pinned: true, sticky: { prefill: "p1", decode: "d1" } }));
    expect(r).toMatchObject({ mode: "local", reason: "pinned" });
    expect(r.decode.id).toBe("d1");
  });

  it("a local prefill fails over to any D through a P (issue 25 item 5)", () => {
    const decode = [vllmD("d0"), vllmD("d1"), node("d2", { localPrefill: false })];
    const key = testKeys(200).find((k) => dOf(k, ["d0", "d1", "d2"]) === "d0")!;
    const r = decided(conditional({ key, decode, prefixMatches: { prefill: {}, decode: { d0: 18 } } }));
    expect(r.mode).toBe("local");
    expect([...r.decode.fallbacks].sort()).toEqual(["d1", "d2"]);
  });

  it("under `always` every request is disaggregated, reason always, whatever D holds (today's behaviour)", () => {
    const r = decided(conditional({ policy: { disaggregation: "always" }, prefixMatches: { prefill: {}, decode: { d0: 20, d1: 20 } } }));
    expect(r).toMatchObject({ mode: "disaggregated", reason: "always" });
    expect(r.prefill.id.startsWith("p")).toBe(true);
  });
});

describe("decode first: P relative to the chosen D", () => {
  const prefill = [node("pa", { group: "A" }), node("pb", { group: "B" })];
  const decode = [vllmD("da", { group: "A" }), vllmD("db", { group: "B" })];
  /** a key whose D is da and whose best P overall is pb */
  const key = testKeys(2000).find((k) => dOf(k, ["da", "db"]) === "da" && pOf(k, prefill) === "pb")!;
  const cold = (pdGroup: "off" | "prefer" | "strict", fields: InputFields = {}) =>
    decided(conditional({ key, prefill, decode, ...fields, policy: { pdGroup, loadFactor: 10, ...fields.policy } }));

  it("off: P by the prefill policy alone", () => {
    expect(cold("off")).toMatchObject({ decode: { id: "da" }, prefill: { id: "pb" } });
  });

  it("prefer: the P of D's group while its load is within the bonus", () => {
    expect(cold("prefer").prefill).toMatchObject({ id: "pa", rule: "pdgroup_prefer" });
    const busyA = [node("pa", { group: "A", load: 3 }), node("pb", { group: "B", load: 1 })];
    expect(cold("prefer", { prefill: busyA }).prefill.id).toBe("pb");
  });

  it("strict: P in D's group; when it has none, D's ranking is walked to a D whose group has one", () => {
    const strict = cold("strict");
    expect(strict.prefill.id).toBe("pa");
    const noPa = [node("pa", { group: "A", healthy: false }), node("pb", { group: "B" })];
    const walked = cold("strict", { prefill: noPa });
    expect(walked.decode).toMatchObject({ id: "db", rule: "pdgroup_strict" });
    expect(walked.prefill.id).toBe("pb");
    expect(walked.decode.candidates.find((c) => c.id === "da")?.skipped).toBe("group");
  });

  it("`both` nodes: the D that would prefill the request is no P for it while another may take it", () => {
    const pool = ["n0", "n1", "n2"].map((id) => vllmD(id));
    for (const k of testKeys(50)) {
      const r = decided(conditional({ key: k, prefill: pool, decode: pool }));
      expect(r.mode).toBe("disaggregated");
      expect(r.prefill.id).not.toBe(r.decode.id);
    }
  });
});

describe("balancing work (issue 17 item 4)", () => {
  it("least_load weighs in-flight requests by their tokens: two long prompts outweigh three short ones", () => {
    const decode = [node("d0", { load: 2, work: 40_000 }), node("d1", { load: 3, work: 3_000 })];
    const r = decided(selectRoute(selection({ decode, policy: { decode: "least_load" } })));
    expect(r.decode.id).toBe("d1");
    expect(r.decode.candidates.find((c) => c.id === "d0")).toMatchObject({ load: 2, loadTokens: 40_000 });
  });

  it("cache_aware sends a cold prompt to the node that did the least work lately, not the fewest requests", () => {
    // d0 took many cheap warm turns, d1 a few long cold prompts (and each is within its request share)
    const decode = [node("d0", { recent: 5_000, recentRequests: 25 }), node("d1", { recent: 60_000, recentRequests: 10 }), node("d2", { recent: 30_000, recentRequests: 30 })];
    const r = decided(selectRoute(selection({ decode, promptChars: PROMPT_CHARS, policy: { decode: "cache_aware" } })));
    expect(r.decode.id).toBe("d0");
  });

  it("prefer respects the KV barrier: an in-group D near a full cache loses to an idle D elsewhere (SPEC 5 + the guard)", () => {
    const prefill = [node("pa", { group: "A" })];
    const decode = [node("da", { group: "A", signals: { kvUsage: 0.8, queue: 0, ageMs: 10 } }), node("db", { group: "B" })];
    // da's load is 0 requests + 4 (0.8 / 0.2) against db's 0
    const route = selection({ key: "k", prefill, decode, guard, policy: { pdGroup: "prefer", decode: "least_load" } });
    expect(decided(selectRoute(route)).decode.id).toBe("db");
    // an idle cluster (engines report no KV in use) stays in the group, as SPEC 5 has it
    const idle = decode.map((n) => (n.id === "da" ? { ...n, signals: { kvUsage: 0, queue: 0, ageMs: 10 } } : n));
    expect(decided(selectRoute({ ...route, decode: idle })).decode.id).toBe("da");
    // and so does one whose in-group D's last poll caught a request mid-flight (a quiet 0.001)
    const caught = decode.map((n) => (n.id === "da" ? { ...n, signals: { kvUsage: 0.001, queue: 0, ageMs: 10 } } : n));
    expect(decided(selectRoute({ ...route, decode: caught })).decode.id).toBe("da");
    // a little KV in use (0.1: 0.11 requests) against a best D holding one request: within the bonus
    const calm = [node("da", { group: "A", signals: { kvUsage: 0.1, queue: 0, ageMs: 10 } }), node("db", { group: "B", load: 1, work: 500 })];
    expect(decided(selectRoute({ ...route, decode: calm })).decode.id).toBe("da");
  });

  it("strict respects the guard: a busy in-group D is walked past to a group whose D may take work", () => {
    const prefill = [node("pa", { group: "A" }), node("pb", { group: "B" })];
    const decode = [node("da", { group: "A", signals: { kvUsage: 0.95, queue: 0, ageMs: 10 } }), node("db", { group: "B" })];
    const key = testKeys(500).find((k) => pOf(k, prefill) === "pa")!;
    const r = decided(selectRoute(selection({ key, prefill, decode, guard, policy: { pdGroup: "strict" } })));
    expect(r.prefill.id).toBe("pb");
    expect(r.decode.id).toBe("db");
  });
});

describe("every conditional decision (properties)", () => {
  const pools = fc
    .array(
      fc.record({
        load: fc.nat(6),
        work: fc.nat(50_000),
        healthy: fc.boolean(),
        localPrefill: fc.boolean(),
        kv: fc.option(fc.double({ min: 0, max: 1, noNaN: true }), { nil: null }),
        queue: fc.nat(12),
        group: fc.constantFrom("A", "B"),
      }),
      { minLength: 1, maxLength: 5 },
    )
    .map((rows) =>
      rows.map((r, i) =>
        node(`n${i}`, {
          load: r.load,
          work: r.load > 0 ? r.work + r.load : 0,
          healthy: r.healthy,
          localPrefill: r.localPrefill,
          group: r.group,
          signals: r.kv === null ? null : { kvUsage: r.kv, queue: r.queue, ageMs: 10, kvCapacityTokens: 8192 },
        }),
      ),
    );
  const policies = fc.constantFrom<PolicyName>("round_robin", "affinity", "cache_aware", "least_load");

  it("never gives a local prefill to a node without localPrefill or to a busy one; a local prefill has no P; P is never D while another P may serve", () => {
    fc.assert(
      fc.property(
        pools,
        pools,
        policies,
        policies,
        fc.constantFrom("off", "prefer", "strict" as const),
        fc.nat(20),
        fc.boolean(),
        (prefill, decode, p, d, pdGroup, matched, pinned) => {
          const input = selection({
            prefill: prefill.map((n) => ({ ...n, id: `p${n.id}` })),
            decode,
            guard,
            promptChars: PROMPT_CHARS,
            prefixBlockCount: 20,
            prefixMatches: { prefill: {}, decode: { n0: matched } },
            pinned,
            sticky: pinned ? { prefill: "pn0", decode: "n0" } : null,
            policy: { prefill: p, decode: d, pdGroup, disaggregation: "conditional" },
          });
          const result = selectRoute(input);
          expect(selectRoute(input)).toEqual(result);
          if (!result.ok) return;
          const r = result.value;
          const dNode = decode.find((n) => n.id === r.decode.id)!;
          if (r.mode === "local") {
            expect(r.prefill.id).toBe(r.decode.id);
            expect(r.prefill.rule).toBe("local_prefill");
            if (r.reason !== "pinned") {
              expect(dNode.localPrefill).toBe(true);
              const s = dNode.signals;
              if (s && s.kvUsage !== null) expect(s.kvUsage).toBeLessThan(guard.kvBusy);
              // its D's fallbacks prefill alone too, unless a P/D path is there to fall back to (issue 25 item 5)
              if (r.prefill.fallbacks.length === 0) for (const id of r.decode.fallbacks) expect(decode.find((n) => n.id === id)?.localPrefill).toBe(true);
              for (const id of r.prefill.fallbacks) expect(input.prefill.some((n) => n.id === id)).toBe(true);
            }
          } else {
            expect(r.mode).toBe("disaggregated");
            expect(input.prefill.some((n) => n.id === r.prefill.id)).toBe(true);
          }
        },
      ),
      { numRuns: 400 },
    );
  });
});
