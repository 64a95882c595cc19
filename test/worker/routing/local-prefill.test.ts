import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { cachedEnough, decideLocalPrefill, DISAGG_DECISIONS, type LocalPrefillQuestion } from "../../../src/routing/local-prefill";
import { withoutFileEngines } from "../helpers";

withoutFileEngines();

// SPEC 8's per-request question, pure: does D prefill alone?

const thresholds = { tokens: 2048, ratio: 0.7 };
const ask = (fields: Partial<LocalPrefillQuestion>): LocalPrefillQuestion => ({
  promptTokens: 10_000,
  uncachedTokens: 500,
  thresholds,
  localPrefill: true,
  decodeBusy: false,
  prefillBusy: null,
  ...fields,
});

describe("cached enough: uncached below localPrefillTokens and below localPrefillRatio of the prompt", () => {
  it("takes Dynamo's IslBoundingPolicy examples (ai-dynamo/dynamo conditional_disagg.rs tests)", () => {
    // 1000 prompt, 896 cached: 104 uncached, ratio 0.104
    expect(cachedEnough({ promptTokens: 1000, uncachedTokens: 104, thresholds })).toBe(true);
    // 100k prompt, 64k cached: 36k uncached is over 2048 even with a ratio threshold of 0.99
    expect(cachedEnough({ promptTokens: 100_000, uncachedTokens: 36_000, thresholds: { tokens: 2048, ratio: 0.99 } })).toBe(false);
    // 200 prompt, nothing cached: ratio 1.0
    expect(cachedEnough({ promptTokens: 200, uncachedTokens: 200, thresholds })).toBe(false);
    // exactly at a threshold is not below it
    expect(cachedEnough({ promptTokens: 2048, uncachedTokens: 0, thresholds: { tokens: 0, ratio: 1 } })).toBe(false);
    expect(cachedEnough({ promptTokens: 10_000, uncachedTokens: 7_000, thresholds: { tokens: 100_000, ratio: 0.7 } })).toBe(false);
  });

  it("never says cached for a prompt of unknown size (0 tokens): nothing says it is small", () => {
    expect(cachedEnough({ promptTokens: 0, uncachedTokens: 0, thresholds })).toBe(false);
  });

  it("0 tokens as localPrefillTokens turns local prefill off for cached prompts", () => {
    fc.assert(
      fc.property(fc.nat(100_000), fc.nat(100_000), (prompt, uncached) => !cachedEnough({ promptTokens: prompt, uncachedTokens: uncached, thresholds: { tokens: 0, ratio: 1 } })),
    );
  });
});

describe("decideLocalPrefill", () => {
  it("a warm turn on D: local, reason cached", () => {
    expect(decideLocalPrefill(ask({}))).toEqual({ local: true, reason: "cached" });
  });

  it("a cold long prompt: disaggregated, reason cold", () => {
    expect(decideLocalPrefill(ask({ uncachedTokens: 10_000 }))).toEqual({ local: false, reason: "cold" });
  });

  it("a cold prompt whose P is busy: local, reason prefill_busy (Dynamo's prefill-load bypass)", () => {
    expect(decideLocalPrefill(ask({ uncachedTokens: 10_000, prefillBusy: true }))).toEqual({ local: true, reason: "prefill_busy" });
  });

  it("either bypass is vetoed by a busy D: disaggregated, reason decode_busy", () => {
    expect(decideLocalPrefill(ask({ decodeBusy: true }))).toEqual({ local: false, reason: "decode_busy" });
    expect(decideLocalPrefill(ask({ uncachedTokens: 10_000, prefillBusy: true, decodeBusy: true }))).toEqual({ local: false, reason: "decode_busy" });
  });

  it("a cold prompt on a busy D is cold: nothing asked D to prefill it", () => {
    expect(decideLocalPrefill(ask({ uncachedTokens: 10_000, decodeBusy: true }))).toEqual({ local: false, reason: "cold" });
  });

  it("a node without localPrefill never prefills alone, whatever else holds (property)", () => {
    fc.assert(
      fc.property(fc.nat(50_000), fc.nat(50_000), fc.boolean(), fc.option(fc.boolean(), { nil: null }), (prompt, uncached, decodeBusy, prefillBusy) => {
        const a = decideLocalPrefill(ask({ promptTokens: prompt, uncachedTokens: uncached, decodeBusy, prefillBusy, localPrefill: false }));
        expect(a).toEqual({ local: false, reason: "no_local_prefill" });
      }),
    );
  });

  it("a busy D never prefills alone, and every answer is a (mode, reason) the metrics list (property)", () => {
    const known = new Set(DISAGG_DECISIONS.map((d) => `${d.mode} ${d.reason}`));
    fc.assert(
      fc.property(fc.nat(50_000), fc.nat(50_000), fc.boolean(), fc.boolean(), fc.option(fc.boolean(), { nil: null }), (prompt, uncached, local, decodeBusy, prefillBusy) => {
        const a = decideLocalPrefill(ask({ promptTokens: prompt, uncachedTokens: uncached, localPrefill: local, decodeBusy, prefillBusy }));
        if (decodeBusy) expect(a.local).toBe(false);
        expect(known.has(`${a.local ? "local" : "disaggregated"} ${a.reason}`)).toBe(true);
      }),
    );
  });
});
