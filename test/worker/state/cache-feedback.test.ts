import fc from "fast-check";
import { afterEach, describe, expect, it, vi } from "vitest";
import type { CandidateNode, SelectionInput } from "../../../src/routing/types";
import { CacheFeedback, judge, LOST_AFTER_MISSES, type CachePrediction } from "../../../src/state/cache-feedback";
import { CHARS_PER_TOKEN_MAX, CHARS_PER_TOKEN_MIN, CharsPerToken } from "../../../src/state/chars-per-token";
import { PrefixMemory } from "../../../src/state/prefix-memory";
import { clusterView, decision, routeRequest, viewNode } from "./fixtures";
import { withoutFileEngines } from "../helpers";

withoutFileEngines();

// Cache-hit feedback, pure: predicted vs reported cached tokens per node, and the answers that say
// a node lost its cache (llm-d#2853, aibrix#2287); the prefix memory that keeps and corrects what
// the router believes each node's cache holds.

const prediction = (matched: number, node = "d0"): CachePrediction => ({
  node,
  role: "decode",
  hashes: Array.from({ length: 12 }, (_, i) => `h${i}`),
  matched,
  promptChars: 12 * 2048,
  blockChars: 2048,
});

describe("judge", () => {
  it("a prediction of fewer than 2 blocks says nothing", () => {
    expect(judge(1, 0, true)).toBe("unjudged");
  });
  it("half or more of the predicted blocks found: a hit; a quarter to a half: partial (an eviction); at most a quarter: a miss", () => {
    expect(judge(10, 5, true)).toBe("hit");
    expect(judge(10, 3, true)).toBe("partial");
    expect(judge(10, 2, true)).toBe("miss");
    expect(judge(10, 0, true)).toBe("miss");
  });
  it("an answer without cached tokens from a node that never reported any is not a miss (vLLM without --enable-prompt-tokens-details)", () => {
    expect(judge(10, 0, false)).toBe("unjudged");
  });
});

describe("CacheFeedback", () => {
  it("sums predicted and reported cached tokens per node", () => {
    const f = new CacheFeedback();
    f.report(prediction(10), { node: "d0", promptTokens: 6144, cachedTokens: 4608 }, 4);
    f.report(prediction(4), { node: "d0", promptTokens: 6144, cachedTokens: 2048 }, 4);
    // 10 blocks of 2048 chars at 4 chars a token = 5120; 4 blocks = 2048
    expect(f.totals("d0")).toEqual({ predictedTokens: 5120 + 2048, cachedTokens: 4608 + 2048, cacheLost: 0 });
    expect(f.totals("d1")).toEqual({ predictedTokens: 0, cachedTokens: 0, cacheLost: 0 });
  });

  it("a restart: answers in a row that found none of a well-predicted prefix mean the cache is gone", () => {
    const f = new CacheFeedback();
    // the node has shown it reports cached tokens
    expect(f.report(prediction(10), { node: "d0", promptTokens: 6144, cachedTokens: 5120 }, 4).cacheLost).toBe(false);
    const outcomes = Array.from({ length: LOST_AFTER_MISSES }, () => f.report(prediction(10), { node: "d0", promptTokens: 6144, cachedTokens: 0 }, 4));
    expect(outcomes.map((o) => o.verdict)).toEqual(Array(LOST_AFTER_MISSES).fill("miss"));
    expect(outcomes.at(-1)?.cacheLost).toBe(true);
    expect(outcomes.slice(0, -1).every((o) => !o.cacheLost)).toBe(true);
    expect(f.totals("d0").cacheLost).toBe(1);
  });

  it("a restart behind a shared system prompt: answers in a row that found only that prompt's block mean the cache is gone", () => {
    const f = new CacheFeedback();
    f.report(prediction(10), { node: "d0", promptTokens: 6144, cachedTokens: 5120 }, 4);
    // 10 blocks predicted, 1 found (512 tokens): the system prompt the restarted engine cached again
    const outcomes = Array.from({ length: LOST_AFTER_MISSES }, () => f.report(prediction(10), { node: "d0", promptTokens: 6144, cachedTokens: 512 }, 4));
    expect(outcomes.map((o) => o.verdict)).toEqual(Array(LOST_AFTER_MISSES).fill("miss"));
    expect(outcomes.at(-1)?.cacheLost).toBe(true);
  });

  it("an eviction among hits (a partial answer, or one miss between hits) never throws the node's entries away (property)", () => {
    fc.assert(
      fc.property(fc.array(fc.constantFrom("hit", "partial", "miss"), { maxLength: 40 }), (answers) => {
        const f = new CacheFeedback();
        f.report(prediction(10), { node: "d0", promptTokens: 6144, cachedTokens: 5120 }, 4);
        let streak = 0;
        for (const a of answers) {
          const cached = a === "hit" ? 5120 : a === "partial" ? 1536 : 0;
          const out = f.report(prediction(10), { node: "d0", promptTokens: 6144, cachedTokens: cached }, 4);
          streak = a === "miss" ? streak + 1 : 0;
          expect(out.cacheLost).toBe(streak === LOST_AFTER_MISSES);
          if (out.cacheLost) streak = 0;
        }
      }),
    );
  });

  it("without the details flag (cached never reported) no run of zeros is taken for a lost cache", () => {
    const f = new CacheFeedback();
    for (let i = 0; i < 10; i++) expect(f.report(prediction(10), { node: "d0", promptTokens: 6144, cachedTokens: 0 }, 4).cacheLost).toBe(false);
  });
});

describe("CharsPerToken", () => {
  it("starts at 4, learns a node's rate from its answers, and lends the pool's until the node has its own", () => {
    const r = new CharsPerToken();
    expect(r.of("d0")).toBe(4);
    for (let i = 0; i < 400; i++) r.observe("d0", 3000, 1000);
    expect(r.of("d0")).toBeCloseTo(3, 1);
    // d1 never answered: the pool's rate (learned from d0)
    expect(r.of("d1")).toBeCloseTo(3, 1);
    for (let i = 0; i < 400; i++) r.observe("d1", 5000, 1000);
    expect(r.of("d1")).toBeCloseTo(5, 1);
    expect(r.of("d0")).toBeCloseTo(3, 1);
  });

  it("one answer moves it a little (smoothing), and nothing takes it outside [1, 8] (property)", () => {
    const r = new CharsPerToken();
    for (let i = 0; i < 200; i++) r.observe("d0", 4000, 1000);
    r.observe("d0", 80_000, 1000);
    expect(r.of("d0")).toBeLessThan(4.5);
    fc.assert(
      fc.property(fc.array(fc.tuple(fc.nat(1_000_000), fc.nat(100_000)), { maxLength: 60 }), (samples) => {
        const learner = new CharsPerToken();
        for (const [chars, tokens] of samples) learner.observe("n", chars, tokens);
        const rate = learner.of("n");
        expect(rate).toBeGreaterThanOrEqual(CHARS_PER_TOKEN_MIN);
        expect(rate).toBeLessThanOrEqual(CHARS_PER_TOKEN_MAX);
      }),
    );
  });
});

const HASHES = ["h1", "h2", "h3", "h4"];
const cand = (id: string) => ({ id }) as CandidateNode;
const input = (prefill: string[], decode: string[], fields: Partial<SelectionInput> = {}) =>
  ({ colocated: false, prefill: prefill.map(cand), decode: decode.map(cand), prefixMatches: { prefill: { p0: 3 }, decode: { d0: 1 } }, ...fields }) as SelectionInput;
const CACHE = { blockChars: 512, loadFactor: 3, shareFactor: 1.1, shareHalfLife: 1000, maxBlocksPerRequest: 3 };
const holders = (m: PrefixMemory, role: "prefill" | "decode", nodes: string[]) => m.index[role].match(HASHES, nodes);

afterEach(() => vi.restoreAllMocks());

describe("a routed request", () => {
  it("disaggregated: predicts what P holds; P and D hold the prompt now, each in its pool's index, up to maxBlocksPerRequest and the end", () => {
    const m = new PrefixMemory(100);
    const prediction = m.routed(routeRequest({ prefixHashes: HASHES, promptChars: 2048 }), decision("p0", "d0"), input(["p0"], ["d0"]), CACHE);
    // 4 blocks, 3 recorded a request: the lease keeps the head and the end
    expect(prediction).toEqual({ node: "p0", role: "prefill", hashes: ["h1", "h2", "h3"], endHash: "h4", matched: 3, promptChars: 2048, blockChars: 512 });
    expect(holders(m, "prefill", ["p0", "d0"])).toEqual({ p0: 4, d0: 0 });
    expect(holders(m, "decode", ["p0", "d0"])).toEqual({ p0: 0, d0: 4 });
    // the head and the end are kept, the blocks between them not
    expect(m.index.prefill.match(["h1", "h2", "h3", "h4", "h5"], ["p0"])).toEqual({ p0: 4 });
    expect(m.index.prefill.match(["h1", "h2", "h3", "x4"], ["p0"])).toEqual({ p0: 3 });
  });

  it("served by D alone (a local prefill, or colocated): predicts what D holds, and only D holds it", () => {
    for (const [d, inp] of [
      [decision("d0", "d0", { mode: "local", prefillRule: "local_prefill" }), input(["p0"], ["d0"])],
      [decision("d0", "d0", { mode: "colocated", prefillRule: "colocated" }), input([], ["d0"], { colocated: true })],
    ] as const) {
      const m = new PrefixMemory(100);
      expect(m.routed(routeRequest({ prefixHashes: HASHES }), d, inp, CACHE)).toMatchObject({ node: "d0", role: "decode", matched: 1 });
      expect(holders(m, "prefill", ["p0", "d0"])).toEqual({ p0: 0, d0: 0 });
      expect(holders(m, "decode", ["d0"])).toEqual({ d0: 4 });
    }
  });

  it("a node of role both has one cache: each pool's index learns it", () => {
    const m = new PrefixMemory(100);
    m.routed(routeRequest({ prefixHashes: HASHES }), decision("b0", "b0"), input(["b0"], ["b0"]), CACHE);
    expect(holders(m, "prefill", ["b0"])).toEqual({ b0: 4 });
    expect(holders(m, "decode", ["b0"])).toEqual({ b0: 4 });
  });
});

describe("an engine's answer", () => {
  const view = clusterView([viewNode("p0", "prefill"), viewNode("d0", "decode"), viewNode("b0", "both")]);
  const prediction = (node: string) => ({ node, role: "decode" as const, hashes: ["h1", "h2", "h3"], endHash: "h5", matched: 3, promptChars: 5 * 512, blockChars: 512 });

  it("teaches the node's characters per token (when the prompt's size is known)", () => {
    const m = new PrefixMemory(100);
    for (let i = 0; i < 20; i++) m.learn({ promptChars: 1_000 }, { node: "d0", promptTokens: 1_000, cachedTokens: 0 }, view);
    expect(m.rates.of("d0")).toBeLessThan(1.5);
    m.learn({ promptChars: 0 }, { node: "p0", promptTokens: 1_000, cachedTokens: 0 }, view);
    m.learn(undefined, { node: "p0", promptTokens: 1_000, cachedTokens: 0 }, view);
    expect(m.status("p0").charsPerToken).toBe(Math.round(m.rates.of("d0") * 1000) / 1000);
  });

  it("is counted against the prediction the lease kept, only from the node predicted for; another node's answer counts its cached tokens alone (SPEC 8: under every policy)", () => {
    const m = new PrefixMemory(100);
    m.learn({ prediction: prediction("d0") }, { node: "d0", promptTokens: 400, cachedTokens: 256 }, view);
    m.learn({ prediction: prediction("d0") }, { node: "d1", promptTokens: 400, cachedTokens: 256 }, view);
    expect(m.status("d0")).toMatchObject({ predictedTokens: 384, cachedTokens: 256, cacheLost: 0 });
    expect(m.status("d1")).toMatchObject({ predictedTokens: 0, cachedTokens: 256 });
    // no prediction at all (a policy without the prefix index): the engine's figure still counts
    m.learn({}, { node: "d2", promptTokens: 400, cachedTokens: 128 }, view);
    expect(m.status("d2")).toMatchObject({ predictedTokens: 0, cachedTokens: 128, cacheLost: 0 });
  });

  it("a node that lost its cache: its entries go, but for this prompt, in every pool it serves; the log says so once", () => {
    const warn = vi.spyOn(console, "warn").mockImplementation(() => undefined);
    const m = new PrefixMemory(100);
    m.index.prefill.record(["x1", "x2"], "b0");
    m.index.decode.record(["x1", "x2"], "b0");
    m.learn({ prediction: prediction("b0") }, { node: "b0", promptTokens: 400, cachedTokens: 384 }, view);
    for (let i = 0; i < LOST_AFTER_MISSES; i++) m.learn({ prediction: prediction("b0") }, { node: "b0", promptTokens: 400, cachedTokens: 0 }, view);
    expect(m.status("b0").cacheLost).toBe(1);
    for (const role of ["prefill", "decode"] as const) {
      expect(m.index[role].match(["x1"], ["b0"])).toEqual({ b0: 0 });
      expect(m.index[role].match(["h1", "h2", "h3"], ["b0"])).toEqual({ b0: 3 });
      // and its end, past the head the lease kept
      expect(m.index[role].match(["h1", "h2", "h3", "h4", "h5"], ["b0"])).toEqual({ b0: 5 });
    }
    expect(warn.mock.calls.map((c) => JSON.parse(String(c[0])))).toEqual([{ event: "prefix_cache_forgotten", node: "b0", reason: "cache_lost" }]);
  });

  it("without a cluster view the loss is counted, and nothing is forgotten", () => {
    const m = new PrefixMemory(100);
    m.index.decode.record(["x1"], "d0");
    m.learn({ prediction: prediction("d0") }, { node: "d0", promptTokens: 400, cachedTokens: 384 }, null);
    for (let i = 0; i < LOST_AFTER_MISSES; i++) m.learn({ prediction: prediction("d0") }, { node: "d0", promptTokens: 400, cachedTokens: 0 }, null);
    expect(m.status("d0").cacheLost).toBe(1);
    expect(m.index.decode.match(["x1"], ["d0"])).toEqual({ d0: 1 });
  });
});

describe("forgetting a node", () => {
  it("a restart forgets its entries and logs why; a node removed from the document takes its rate and feedback too", () => {
    const warn = vi.spyOn(console, "warn").mockImplementation(() => undefined);
    const m = new PrefixMemory(100);
    m.index.decode.record(["x1"], "d0");
    for (let i = 0; i < 20; i++) m.learn({ promptChars: 1_000 }, { node: "d0", promptTokens: 1_000, cachedTokens: 0 }, null);
    m.forget("d0", "probes_recovered");
    expect(m.sizes()).toEqual({ prefillEntries: 0, decodeEntries: 0, maxEntries: 100 });
    expect(m.index.decode.match(["x1"], ["d0"])).toEqual({ d0: 0 });
    expect(m.rates.of("d0")).toBeLessThan(1.5);
    expect(warn).toHaveBeenCalledOnce();
    m.forgetNode("d0");
    // the pool's rate, learned from d0's answers too, stays
    expect(m.rates.of("d0")).toBe(m.rates.of("never-seen"));
    expect(m.status("d0")).toMatchObject({ predictedTokens: 0, cachedTokens: 0, cacheLost: 0 });
    expect(warn).toHaveBeenCalledOnce();
  });
});
