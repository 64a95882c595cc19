import { describe, expect, it } from "vitest";
import { CacheFeedback, LOST_AFTER_MISSES, type CachePrediction } from "../../../src/state/cache-feedback";
import { withoutFileEngines } from "../helpers";

withoutFileEngines();

// The benchmark's "without feedback" (TEST_CACHE_FEEDBACK=count_only): the same answers are
// counted and judged, but a node that lost its cache is never reported as such, so its prefix
// index entries stay (the comparison in docs/benchmark-results.md, trace with evictions and a restart).

const prediction: CachePrediction = {
  node: "n0",
  role: "prefill",
  hashes: Array.from({ length: 12 }, (_, i) => `h${i}`),
  matched: 10,
  promptChars: 12 * 2048,
  blockChars: 2048,
};

describe("CacheFeedback that only counts", () => {
  it("counts predicted and reported cached tokens like the correcting one, and never says the cache was lost", () => {
    const correcting = new CacheFeedback();
    const counting = new CacheFeedback(false);
    const answers = [5120, ...Array(LOST_AFTER_MISSES * 3).fill(0)];
    const lost = { correcting: 0, counting: 0 };
    for (const cachedTokens of answers) {
      const usage = { node: "n0", promptTokens: 6144, cachedTokens };
      if (correcting.report(prediction, usage, 4).cacheLost) lost.correcting++;
      const o = counting.report(prediction, usage, 4);
      if (o.cacheLost) lost.counting++;
      if (cachedTokens === 0) expect(o.verdict).toBe("miss");
    }
    expect(lost).toEqual({ correcting: 3, counting: 0 });
    const { predictedTokens, cachedTokens } = correcting.totals("n0");
    expect(counting.totals("n0")).toEqual({ predictedTokens, cachedTokens, cacheLost: 0 });
  });
});
