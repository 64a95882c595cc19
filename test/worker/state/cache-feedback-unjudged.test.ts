import { describe, expect, it } from "vitest";
import { CacheFeedback, LOST_AFTER_MISSES, MIN_PREDICTED_BLOCKS, type CachePrediction } from "../../../src/state/cache-feedback";
import { withoutFileEngines } from "../helpers";

withoutFileEngines();

// An answer the feedback cannot judge says nothing about the node's cache: it neither adds to a
// run of misses nor ends one (src/state/cache-feedback.ts). A restarted node's misses come
// between short prompts and answers without the details field; those must not hide the restart.

const prediction = (matched: number): CachePrediction => ({
  node: "d0",
  role: "decode",
  hashes: Array.from({ length: 12 }, (_, i) => `h${i}`),
  matched,
  promptChars: 12 * 2048,
  blockChars: 2048,
});
const usage = (cachedTokens: number) => ({ node: "d0", promptTokens: 6144, cachedTokens });
/** 10 blocks predicted, none found: a miss from a node that has reported cached tokens before */
const miss = (f: CacheFeedback) => f.report(prediction(10), usage(0), 4);
/** a prediction too short to judge (under MIN_PREDICTED_BLOCKS), whatever the answer */
const unjudged = (f: CacheFeedback, cached: number) => f.report(prediction(MIN_PREDICTED_BLOCKS - 1), usage(cached), 4);

describe("an unjudged answer leaves the miss streak alone", () => {
  it("between misses it neither ends the run nor adds to it", () => {
    const f = new CacheFeedback();
    f.report(prediction(10), usage(5120), 4); // the node reports cached tokens
    const outcomes = [];
    for (let i = 0; i < LOST_AFTER_MISSES; i++) {
      outcomes.push(miss(f));
      // a short prompt the node served from cache, and one it did not: neither says anything
      if (i < LOST_AFTER_MISSES - 1) outcomes.push(unjudged(f, 512), unjudged(f, 0));
    }
    expect(outcomes.map((o) => o.verdict)).toEqual(["miss", "unjudged", "unjudged", "miss", "unjudged", "unjudged", "miss"]);
    // the third miss ends the run: the unjudged answers between did not reset it
    expect(outcomes.map((o) => o.cacheLost)).toEqual([false, false, false, false, false, false, true]);
    expect(f.totals("d0").cacheLost).toBe(1);
  });

  it("after misses short of the run, unjudged answers alone never complete it", () => {
    const f = new CacheFeedback();
    f.report(prediction(10), usage(5120), 4);
    for (let i = 0; i < LOST_AFTER_MISSES - 1; i++) miss(f);
    for (let i = 0; i < 10; i++) expect(unjudged(f, 0).cacheLost).toBe(false);
    expect(miss(f).cacheLost).toBe(true);
  });
});
