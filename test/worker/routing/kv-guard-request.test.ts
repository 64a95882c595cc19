import { describe, expect, it } from "vitest";
import { isBusyFor } from "../../../src/routing/kv-guard";
import { selectRoute } from "../../../src/routing/select";
import type { CandidateNode, GuardSettings, PolicyName } from "../../../src/routing/types";
import { decided, node, selection } from "./fixtures";
import { withoutFileEngines } from "../helpers";

withoutFileEngines();

// The decode KV guard counts the request itself (SPEC 8 busy decode node; issue 17's proof): a
// decode node holds the whole prompt of every request it runs, and on the agentic workload one
// prompt can be half a node's KV, so a node just under kvBusy given one lands at the wall.

const GUARD: GuardSettings = { kvBusy: 0.9, queueBusy: 8 };
const CAPACITY = 100_000;
const at = (id: string, kvUsage: number) => node(id, { signals: { kvUsage, queue: 0, ageMs: 100, kvCapacityTokens: CAPACITY } });
/** a prompt of `tokens` tokens at 4 characters a token */
const route = (decode: CandidateNode[], tokens: number, policy: PolicyName = "least_load") =>
  selectRoute(selection({ decode, policy: { prefill: "round_robin", decode: policy }, guard: GUARD, promptChars: tokens * 4 }));

describe("a decode node is busy for a request its prompt would take to kvBusy", () => {
  it("the pure rule: busy already, or its projected use plus the prompt's share reaches kvBusy", () => {
    expect(isBusyFor(at("d", 0.5), GUARD, 30_000)).toBe(false); // 0.8
    expect(isBusyFor(at("d", 0.65), GUARD, 30_000)).toBe(true); // 0.95
    expect(isBusyFor(at("d", 0.95), GUARD, 0)).toBe(true);
    // without a reported capacity the reading alone decides
    expect(isBusyFor(node("d", { signals: { kvUsage: 0.6, queue: 0, ageMs: 1 } }), GUARD, 1e9)).toBe(false);
    // a prompt that alone is kvBusy of the capacity: judged by the node's state alone
    expect(isBusyFor(at("d", 0.3), GUARD, 95_000)).toBe(false);
  });

  it.each(["least_load", "round_robin", "affinity", "cache_aware"] as PolicyName[])(
    "%s: a long prompt goes to the node with room for it, a short one may take the fuller node",
    (policy) => {
      const decode = [at("d0", 0.6), at("d1", 0.7)];
      // 0.6 + 0.35 >= 0.9 but 0.7 + 0.35 too: with 35,000 tokens neither has room
      const none = route(decode, 35_000, policy);
      expect(none.ok).toBe(false);
      expect(!none.ok && none.error.kind).toBe("decode_busy");
      // 25,000 tokens: d0 (0.85) has room, d1 (0.95) has not
      expect(decided(route(decode, 25_000, policy)).decode.id).toBe("d0");
      const flipped = [at("d0", 0.7), at("d1", 0.6)];
      expect(decided(route(flipped, 25_000, policy)).decode.id).toBe("d1");
      // a short prompt fits on both: neither is busy for it
      const short = decided(route(decode, 1_000, policy));
      expect(short.decode.candidates.every((c) => c.busy === false)).toBe(true);
    },
  );
});
