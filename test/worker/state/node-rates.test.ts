import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { DEFAULT_PROFILE, prefillContextFactor, profileRates } from "../../../src/routing/predict";
import { type LegSample, NodeRateTable, profileOf, RATE_HALF_LIFE_MS } from "../../../src/state/node-rates";
import { coversPrevious, PRECISION_BLOCK_TOKENS, RoutingPrecision } from "../../../src/state/routing-precision";

const profile = () => DEFAULT_PROFILE;
const prior = profileRates(DEFAULT_PROFILE);
/** A P leg of `tokens` cold tokens that took `ms`, nothing ahead, D pulled them all. */
const leg = (ms: number, tokens = 2000, extra: Partial<LegSample> = {}): LegSample => ({
  prefiller: "p0",
  decode: "d0",
  disaggregated: true,
  aheadCost: 0,
  promptTokens: tokens,
  cachedTokens: 0,
  transferTokens: tokens,
  prefillMs: ms,
  ...extra,
});

describe("learned rates: the prior first, then what the legs show", () => {
  it("a node never seen has its profile's rates (a node's own profile over the pool's)", () => {
    const t = new NodeRateTable();
    expect(t.view("x", profile(), 0)).toEqual(prior);
    expect(profileOf({ prefillTokensPerS: 5000 }, { decodeStepMs: 10 })).toEqual({ prefillTokensPerS: 5000, decodeStepMs: 10, transferGBPerS: 10 });
    expect(t.view("x", profileOf({ prefillTokensPerS: 5000 }, undefined), 0).prefillMsPerToken).toBeCloseTo(0.2);
  });

  it("prefill: ms per token at context 0, the leg's time over its work (queue ahead included, attention weighed)", () => {
    const t = new NodeRateTable();
    const factor = prefillContextFactor(1000);
    // 2,000 tokens in 400 ms, many times over: 0.2 ms a token at their context
    for (let i = 0; i < 50; i++) t.learn(leg(400 * factor), i * 100, profile);
    expect(t.view("p0", profile(), 5000).prefillMsPerToken).toBeCloseTo(0.2, 1);
    // 2,000 tokens queued ahead: the same leg time is half the rate
    const q = new NodeRateTable();
    for (let i = 0; i < 50; i++) q.learn(leg(400 * factor, 2000, { aheadCost: 2000 }), i * 100, profile);
    expect(q.view("p0", profile(), 5000).prefillMsPerToken).toBeLessThan(0.15);
  });

  it("a node made twice as slow is learned within a minute of traffic (a request a second)", () => {
    const t = new NodeRateTable();
    let now = 0;
    for (; now < 60_000; now += 1000) t.learn(leg(200), now, profile);
    const before = t.view("p0", profile(), now).prefillMsPerToken;
    for (const end = now + 60_000; now < end; now += 1000) t.learn(leg(400), now, profile);
    const after = t.view("p0", profile(), now).prefillMsPerToken;
    expect(after / before).toBeGreaterThan(1.9);
    expect(after / before).toBeLessThan(2.05);
  });

  it("an idle node drifts back to its profile (a restart is learned afresh)", () => {
    const t = new NodeRateTable();
    for (let i = 0; i < 30; i++) t.learn(leg(2000), i * 1000, profile);
    expect(t.view("p0", profile(), 30_000).prefillMsPerToken).toBeGreaterThan(prior.prefillMsPerToken * 3);
    expect(t.view("p0", profile(), 30_000 + 20 * RATE_HALF_LIFE_MS).prefillMsPerToken).toBeCloseTo(prior.prefillMsPerToken, 3);
  });

  it("decode step from a stream's pace; transfer from D's first byte less P's answer and a step; a local prefill teaches D's prefill rate", () => {
    const t = new NodeRateTable();
    for (let i = 0; i < 40; i++) t.learn(leg(100, 2000, { ttftMs: 100 + 30 + 50, streamEvents: 102, streamSpanMs: 1000 }), i * 500, profile);
    const d = t.view("d0", profile(), 20_000);
    expect(d.decodeStepMs).toBeCloseTo(10, 0);
    // 50 ms more than P and a prior step (30, learning towards 10): 2,000 tokens in ~50-70 ms
    const transfer2000 = d.handoffMs + 2000 * d.transferMsPerToken;
    expect(transfer2000).toBeGreaterThan(40);
    expect(transfer2000).toBeLessThan(80);
    const local = new NodeRateTable();
    for (let i = 0; i < 40; i++) local.learn({ ...leg(0), prefiller: "d0", disaggregated: false, prefillMs: undefined, ttftMs: 430, transferTokens: 0 }, i * 500, profile);
    expect(local.view("d0", profile(), 20_000).prefillMsPerToken).toBeCloseTo(400 / 2000 / prefillContextFactor(1000), 2);
  });

  it("transfer as a line against the tokens D lacked: a fixed hand-off and ms a token, each learned", () => {
    const t = new NodeRateTable();
    // D's first byte: 200 ms whatever the size, plus 0.01 ms a token (P answered at 100, D steps at the prior's 30)
    for (let i = 0; i < 60; i++) {
      const tokens = i % 2 === 0 ? 1000 : 40_000;
      t.learn(leg(100, tokens, { ttftMs: 100 + 200 + 0.01 * tokens + 30 }), i * 200, profile);
    }
    const d = t.view("d0", profile(), 12_000);
    expect(d.handoffMs).toBeGreaterThan(150);
    expect(d.handoffMs).toBeLessThan(250);
    expect(d.transferMsPerToken).toBeCloseTo(0.01, 2);
    // a node never seen: one of its decode steps of hand-off (the profile's here), the profile's rate
    expect(t.view("d9", profile(), 12_000)).toMatchObject({ handoffMs: DEFAULT_PROFILE.decodeStepMs, transferMsPerToken: prior.transferMsPerToken });
  });

  it("a D that has pulled little is priced one of its own decode steps of hand-off, until its pulls show their own", () => {
    const t = new NodeRateTable();
    // streams teach d0 a 10 ms step (its profile says 30); it has pulled nothing yet
    for (let i = 0; i < 40; i++) t.learn(leg(0, 2000, { prefillMs: undefined, streamEvents: 102, streamSpanMs: 1000 }), i * 200, profile);
    const stepped = t.view("d0", profile(), 8000);
    expect(stepped.decodeStepMs).toBeCloseTo(10, 0);
    expect(stepped.handoffMs).toBeCloseTo(stepped.decodeStepMs, 5);
    // one short pull whose hand-off was 2 ms (D's first byte 2 ms and a step of 10 after P's
    // answer): it is priced between its prior and that pull
    t.learn(leg(50, 200, { ttftMs: 50 + 2 + 10 }), 8000, profile);
    const one = t.view("d0", profile(), 8000).handoffMs;
    expect(one).toBeGreaterThan(2);
    expect(one).toBeLessThan(stepped.decodeStepMs);
    // many pulls of 2 ms hand-off at two sizes: priced near them, far under the prior step (the
    // prior's two points, at the profile's slower rate, still lift it a little)
    for (let i = 0; i < 60; i++) {
      const tokens = i % 2 === 0 ? 200 : 20_000;
      t.learn(leg(50, tokens, { ttftMs: 50 + 2 + 0.001 * tokens + 10 }), 8000 + i * 200, profile);
    }
    const learned = t.view("d0", profile(), 20_000).handoffMs;
    expect(learned).toBeLessThan(6);
  });

  it("decode step against the batch: the line through streams at different batch sizes", () => {
    const t = new NodeRateTable();
    // 10 ms a step alone, 1 ms more for each further sequence
    for (let i = 0; i < 60; i++) {
      const batch = 1 + (i % 30);
      t.learn(leg(0, 2000, { prefillMs: undefined, batch, streamEvents: 102, streamSpanMs: 100 * (10 + (batch - 1)) }), i * 200, profile);
    }
    const r = t.view("d0", profile(), 12_000);
    expect(r.decodeStepMs).toBeCloseTo(10, 0);
    expect(r.decodeMsPerSeq).toBeCloseTo(1, 1);
    // a node never measured: the profile's step, flat
    expect(t.view("d9", profile(), 0)).toMatchObject({ decodeStepMs: 30, decodeMsPerSeq: 0 });
  });

  it("tokens a request decodes: the mean of the cluster's streams, the same on every node; the prior before any, and again after an idle while", () => {
    const t = new NodeRateTable();
    expect(t.view("d0", profile(), 0).decodeTokens).toBe(256);
    // streams of 1,000 and 10 tokens (two events more: [DONE] and a usage frame), on two Ds
    for (let i = 0; i < 50; i++)
      t.learn(leg(0, 2000, { prefillMs: undefined, decode: i % 2 ? "d1" : "d0", streamEvents: i % 2 ? 1002 : 12, streamSpanMs: 1000 }), i * 100, profile);
    const learned = t.view("d9", profile(), 5000).decodeTokens!;
    expect(learned).toBeGreaterThan(450);
    expect(learned).toBeLessThan(520);
    expect(t.view("d0", profile(), 5000).decodeTokens).toBeCloseTo(learned);
    // a non-streamed answer shows no tokens: it teaches nothing
    t.learn(leg(0, 2000, { prefillMs: undefined }), 5000, profile);
    expect(t.view("d9", profile(), 5000).decodeTokens).toBeCloseTo(learned);
    expect(t.view("d9", profile(), 5000 + 20 * 60_000).decodeTokens).toBeCloseTo(256, 0);
  });

  it("an engine that streams several tokens an event (--stream-interval 8): a stream with a usage frame is timed by its tokens, and teaches its node's tokens an event, which times its streams without one", () => {
    // 401 tokens 10 ms apart: the first at once, then one event every 8 (vllm output_processor.py)
    const tokens = 401;
    const content = 1 + Math.ceil((tokens - 1) / 8);
    const stream = (usage: boolean, decode = "d0") =>
      leg(0, 2000, {
        prefillMs: undefined,
        decode,
        // content events, [DONE], and the usage frame when there is one
        streamEvents: content + 1 + (usage ? 1 : 0),
        streamSpanMs: (tokens - 1) * 10,
        ...(usage ? { streamTokens: tokens } : {}),
      });
    const t = new NodeRateTable();
    for (let i = 0; i < 40; i++) t.learn(stream(true), i * 500, profile);
    expect(t.view("d0", profile(), 20_000).decodeStepMs).toBeCloseTo(10, 0);
    expect(t.tokensPerEvent("d0", 20_000)).toBeCloseTo(8, 0);
    expect(t.view("d0", profile(), 20_000).decodeTokens).toBeGreaterThan(380);
    // then streams without a usage frame: the node's tokens an event count their tokens
    for (let i = 40; i < 80; i++) t.learn(stream(false), i * 500, profile);
    expect(t.view("d0", profile(), 40_000).decodeStepMs).toBeCloseTo(10, 0);
    expect(t.view("d0", profile(), 40_000).decodeTokens).toBeGreaterThan(380);
    // a node no usage frame ever timed counts a token an event: its step comes out 8x (all it can know)
    expect(t.tokensPerEvent("d1", 40_000)).toBe(1);
    const u = new NodeRateTable();
    for (let i = 0; i < 40; i++) u.learn(stream(false, "d1"), i * 500, profile);
    expect(u.view("d1", profile(), 20_000).decodeStepMs).toBeGreaterThan(60);
    // one token an event, with a usage frame: a token an event still (the frame is not a token)
    const one = new NodeRateTable();
    for (let i = 0; i < 40; i++)
      one.learn(leg(0, 2000, { prefillMs: undefined, streamEvents: tokens + 2, streamSpanMs: (tokens - 1) * 10, streamTokens: tokens }), i * 500, profile);
    expect(one.tokensPerEvent("d0", 20_000)).toBeCloseTo(1, 5);
    expect(one.view("d0", profile(), 20_000).decodeStepMs).toBeCloseTo(10, 0);
    // a usage frame no engine's events could carry (a broken count) is not believed: counted by events
    const odd = new NodeRateTable();
    for (let i = 0; i < 40; i++) odd.learn(leg(0, 2000, { prefillMs: undefined, streamEvents: tokens + 1, streamSpanMs: (tokens - 1) * 10, streamTokens: 1e12 }), i * 500, profile);
    expect(odd.tokensPerEvent("d0", 20_000)).toBe(1);
    expect(odd.view("d0", profile(), 20_000).decodeStepMs).toBeCloseTo(10, 0);
    expect(odd.view("d0", profile(), 20_000).decodeTokens).toBeLessThan(1000);
  });

  it("rates stay positive (a sequence's step growth and D's hand-off at least 0) and finite whatever the samples (property)", () => {
    fc.assert(
      fc.property(fc.array(fc.tuple(fc.double({ min: -1e6, max: 1e7, noNaN: true }), fc.nat(200_000), fc.nat(100_000), fc.nat(100_000)), { maxLength: 30 }), (samples) => {
        const t = new NodeRateTable();
        samples.forEach(([ms, tokens, cached, ahead], i) =>
          t.learn(leg(ms, tokens, { cachedTokens: cached, aheadCost: ahead, ttftMs: ms, streamEvents: tokens, streamSpanMs: ms }), i * 10, profile),
        );
        for (const node of ["p0", "d0"]) {
          const { decodeMsPerSeq, handoffMs, ...rest } = t.view(node, profile(), samples.length * 10);
          expect(decodeMsPerSeq).toBeGreaterThanOrEqual(0);
          expect(handoffMs).toBeGreaterThanOrEqual(0);
          for (const v of [decodeMsPerSeq, handoffMs, ...Object.values(rest)]) expect(Number.isFinite(v)).toBe(true);
          for (const v of Object.values(rest)) expect(v).toBeGreaterThan(0);
        }
      }),
    );
  });
});

describe("routing precision (pure)", () => {
  it("a follow-up is precise when the engine's cached tokens cover the previous prompt's whole blocks", () => {
    expect(coversPrevious(3000, 2560)).toBe(true);
    expect(coversPrevious(3000, 2048)).toBe(false);
    expect(coversPrevious(PRECISION_BLOCK_TOKENS - 1, 0)).toBeNull();
  });

  it("counts follow-ups of each conversation over the last 15 minutes", () => {
    const p = new RoutingPrecision();
    p.observe("a", 3000, 0, 0);
    expect(p.counts(0)).toEqual({ followUps: 0, precise: 0 });
    p.observe("a", 4000, 2560, 1000);
    p.observe("a", 5000, 0, 2000);
    p.observe("b", 3000, 0, 2000);
    expect(p.counts(2000)).toEqual({ followUps: 2, precise: 1 });
    expect(p.counts(2000 + 16 * 60_000)).toEqual({ followUps: 0, precise: 0 });
  });
});
