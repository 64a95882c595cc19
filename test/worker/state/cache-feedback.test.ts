import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { CacheFeedback, judge, LOST_AFTER_MISSES, type CachePrediction } from "../../../src/state/cache-feedback";
import { CHARS_PER_TOKEN_MAX, CHARS_PER_TOKEN_MIN, CharsPerToken } from "../../../src/state/chars-per-token";

// Cache-hit feedback, pure: predicted vs reported cached tokens per node, and the answers that say
// a node lost its cache (llm-d#2853, aibrix#2287).

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
  it("half or more of the predicted blocks found: a hit; some: partial (an eviction); none: a miss", () => {
    expect(judge(10, 5, true)).toBe("hit");
    expect(judge(10, 3, true)).toBe("partial");
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

  it("an eviction among hits (a partial answer, or one miss between hits) never throws the node's entries away (property)", () => {
    fc.assert(
      fc.property(fc.array(fc.constantFrom("hit", "partial", "miss"), { maxLength: 40 }), (answers) => {
        const f = new CacheFeedback();
        f.report(prediction(10), { node: "d0", promptTokens: 6144, cachedTokens: 5120 }, 4);
        let streak = 0;
        for (const a of answers) {
          const cached = a === "hit" ? 5120 : a === "partial" ? 1024 : 0;
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
