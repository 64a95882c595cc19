import { afterEach, describe, expect, it, vi } from "vitest";
import { USAGE_DETAILS_AFTER_HITS, USAGE_DETAILS_SAMPLE, usageDetailsWarning } from "../../../src/observability/usage-details";
import { PrefillUsageDetails } from "../../../src/state/prefill-usage-details";

// vLLM writes prompt_tokens_details only with --enable-prompt-tokens-details and a non-zero cached
// count, so a P whose prompts never hit its prefix cache writes none either way: answers without
// details are evidence of a missing flag only once the engine has shown hits (its /metrics
// counter vllm:prefix_cache_hits_total grew). `npm start`'s demo showed the warning for a P that
// merely had no hits yet (issue 24).

afterEach(() => vi.restoreAllMocks());

describe("the prompt_tokens_details warning needs the engine to have shown prefix-cache hits", () => {
  it("40 answers without details from a P whose hits counter never grew: no warning, no log (the demo's case)", () => {
    const warn = vi.spyOn(console, "warn").mockImplementation(() => undefined);
    const u = new PrefillUsageDetails();
    u.prefixHits("p0", 0);
    for (let i = 0; i < 40; i++) u.note("p0", false);
    u.prefixHits("p0", 0);
    expect(u.verdict("p0")).toBe("unknown");
    // a counter already above 0 at the first poll shows nothing about this run: no rise, no evidence
    u.prefixHits("p1", 9000);
    u.prefixHits("p1", 9000);
    for (let i = 0; i < 40; i++) u.note("p1", false);
    expect(u.verdict("p1")).toBe("unknown");
    expect(warn).not.toHaveBeenCalled();
  });

  it("hits shown after 30 answers: named once USAGE_DETAILS_AFTER_HITS more came without details, and logged once", () => {
    const warn = vi.spyOn(console, "warn").mockImplementation(() => undefined);
    const u = new PrefillUsageDetails();
    u.prefixHits("p0", 0);
    for (let i = 0; i < 30; i++) u.note("p0", false);
    u.prefixHits("p0", 2048);
    for (let i = 1; i < USAGE_DETAILS_AFTER_HITS; i++) u.note("p0", false);
    expect(u.verdict("p0")).toBe("unknown");
    u.note("p0", false);
    expect(u.verdict("p0")).toBe("missing");
    for (let i = 0; i < 10; i++) u.note("p0", false);
    expect(warn).toHaveBeenCalledOnce();
    expect(JSON.parse(String(warn.mock.calls[0]?.[0]))).toMatchObject({ event: "prefill_usage_details_missing", node: "p0", message: usageDetailsWarning("p0") });
    expect(usageDetailsWarning("p0")).toMatch(/although its \/metrics shows prefix-cache hits/);
  });

  it("a P that reports details once is never named", () => {
    const u = new PrefillUsageDetails();
    u.prefixHits("p0", 0);
    u.prefixHits("p0", 10);
    u.note("p0", true);
    for (let i = 0; i < USAGE_DETAILS_SAMPLE * 2; i++) u.note("p0", false);
    expect(u.verdict("p0")).toBe("reported");
  });
});
