// Builders for selection inputs, so each test states only what it is about.
import type { CandidateNode, Decision, Result, SelectionError, SelectionInput, SelectionPolicy } from "../../../src/routing/types";

export function node(id: string, fields: Partial<CandidateNode> = {}): CandidateNode {
  return { id, weight: 1, group: `own:${id}`, load: 0, healthy: true, drain: false, lastFailureAt: 0, ...fields };
}

export interface InputFields extends Partial<Omit<SelectionInput, "policy">> {
  policy?: Partial<SelectionPolicy>;
}

export function selection(fields: InputFields = {}): SelectionInput {
  const { policy, ...rest } = fields;
  return {
    policy: {
      prefill: "affinity",
      decode: "affinity",
      pdGroup: "off",
      pdGroupBonus: 0.3,
      loadFactor: 1.25,
      // the strict rule (SPEC 5 with loadSlack 0), so the bounds these tests reason about are tight
      loadSlack: 0,
      cacheAware: { blockChars: 512, loadFactor: 3, shareFactor: 1.1, shareHalfLife: 1000, maxBlocksPerRequest: 128 },
      // SPEC 8 defaults (the schema fills them in)
      localPrefillTokens: 2048,
      localPrefillRatio: 0.7,
      ...policy,
    },
    colocated: false,
    prefill: [node("p0"), node("p1")],
    decode: [node("d0"), node("d1")],
    key: "k",
    prefixMatches: { prefill: {}, decode: {} },
    prefixBlockCount: 0,
    sticky: null,
    cursors: { prefill: 0, decode: 0 },
    ...rest,
  };
}

export function decided(result: Result<Decision, SelectionError>): Decision {
  if (!result.ok) throw new Error(`expected a decision, got ${JSON.stringify(result.error)}`);
  return result.value;
}

/** Deterministic pseudo-random hex keys (test data only; the router itself never draws random). */
export function testKeys(count: number, salt = "k"): string[] {
  return Array.from({ length: count }, (_, i) => `${salt}-${i.toString(36)}`);
}
