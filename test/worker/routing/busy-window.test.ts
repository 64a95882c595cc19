import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { selectRoute } from "../../../src/routing/select";
import type { CandidateNode, GuardSettings, PdGroupMode, PolicyName } from "../../../src/routing/types";
import { decided, node, selection } from "./fixtures";
import { withoutFileEngines } from "../helpers";

withoutFileEngines();

// A node inside the window a 503/429 asked for (`busy`, state/route-selection.ts) in the pure
// selection core: like a node the decode KV guard calls busy, it is not picked while another can
// serve and is the last fallback. Decode waits at the edge when every D is busy (decode_busy);
// prefill and one-hop requests, which have no queue, take a busy node rather than refuse.

const GUARD: GuardSettings = { kvBusy: 0.9, queueBusy: 8 };
const POLICIES: PolicyName[] = ["round_robin", "affinity", "cache_aware", "least_load"];

const arbPool = (prefix: string) =>
  fc
    .array(fc.record({ load: fc.nat(10), busy: fc.boolean(), healthy: fc.boolean(), drain: fc.boolean(), group: fc.constantFrom("a", "b") }), { minLength: 1, maxLength: 5 })
    .map((specs) => specs.map((s, i) => node(`${prefix}${i}`, s)));

const input = (prefill: CandidateNode[], decode: CandidateNode[], policy: PolicyName, pdGroup: PdGroupMode = "off", extra = {}) =>
  selection({ prefill, decode, policy: { prefill: policy, decode: policy, pdGroup, loadSlack: 2 }, guard: GUARD, key: "conversation", ...extra });

describe("a node in its busy window", () => {
  it("is passed over for one that is not, shown busy and skipped, and kept as the last fallback", () => {
    for (const policy of POLICIES) {
      const d = decided(selectRoute(input([node("p0", { busy: true }), node("p1", { load: 5 })], [node("d0", { busy: true }), node("d1", { load: 5 })], policy)));
      expect([d.prefill.id, d.decode.id], policy).toEqual(["p1", "d1"]);
      for (const role of ["prefill", "decode"] as const) {
        expect(
          d[role].candidates.find((c) => c.id.endsWith("0")),
          `${policy} ${role}`,
        ).toMatchObject({ busy: true, skipped: "busy" });
        expect(d[role].fallbacks, `${policy} ${role}`).toEqual([role === "prefill" ? "p0" : "d0"]);
      }
    }
  });

  it("every decode node busy: the request waits at the edge (decode_busy); without the guard (one hop, a dry run's picks) one is taken", () => {
    const decode = [node("d0", { busy: true }), node("d1", { busy: true })];
    const guarded = selectRoute(input([node("p0")], decode, "affinity"));
    expect(guarded.ok ? null : guarded.error.kind).toBe("decode_busy");
    const unguarded = decided(selectRoute({ ...input([node("p0")], decode, "affinity"), guard: null }));
    expect(["d0", "d1"]).toContain(unguarded.decode.id);
    expect(unguarded.decode.failOpen).toBe(false);
  });

  it("every prefill node busy: one is still picked, least loaded (prefill never waits for a window)", () => {
    for (const policy of POLICIES) {
      const d = decided(selectRoute(input([node("p0", { busy: true, load: 3 }), node("p1", { busy: true, load: 1 })], [node("d0")], policy)));
      expect(d.prefill.id, policy).toBe("p1");
      expect(d.prefill.fallbacks, policy).toEqual(["p0"]);
      expect(d.prefill.candidates.find((c) => c.id === "p1")?.busy, policy).toBe(true);
    }
  });

  it("(property) busy P or D is never picked while an available one that is not busy exists; a busy P never refuses the request", () => {
    fc.assert(
      fc.property(
        arbPool("p"),
        arbPool("d"),
        fc.constantFrom(...POLICIES),
        fc.constantFrom<PdGroupMode>("off", "prefer", "strict"),
        fc.nat(10),
        (prefill, decode, policy, pdGroup, cursor) => {
          const result = selectRoute(input(prefill, decode, policy, pdGroup, { cursors: { prefill: cursor, decode: cursor } }));
          const open = (pool: CandidateNode[]) => pool.filter((n) => n.healthy && !n.drain && !n.busy);
          if (!result.ok) {
            // never for prefill's windows: clearing them gives the same answer
            const calm = selectRoute(
              input(
                prefill.map((n) => ({ ...n, busy: false })),
                decode,
                policy,
                pdGroup,
                { cursors: { prefill: cursor, decode: cursor } },
              ),
            );
            expect(calm.ok ? "ok" : calm.error.kind).toBe(result.error.kind);
            if (result.error.kind === "decode_busy" && pdGroup !== "strict") expect(open(decode)).toHaveLength(0);
            return;
          }
          const d = result.value;
          for (const [role, pool] of [["prefill", prefill] as const, ["decode", decode] as const]) {
            const picked = pool.find((n) => n.id === d[role].id)!;
            // strict walks P's ranking to a group with a D, down to a busy P if it must
            if (pdGroup !== "strict" && open(pool).length > 0) expect(picked.busy, role).toBe(false);
          }
        },
      ),
      { numRuns: 400 },
    );
  });
});
