import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  ATTENTION_CONTEXT_TOKENS,
  DEFAULT_PROFILE,
  decodeLoadMs,
  hasKvRoom,
  localPrediction,
  type PredictedNode,
  prefillDoneMs,
  prefillHarmMs,
  profileRates,
  queuedTokens,
  remoteTtftMs,
  STICKY_MARGIN,
  waitingSizeOf,
} from "../../../src/routing/predict";
import { choosePredicted, type DecodeCandidate, type PredictedCandidate } from "../../../src/routing/select-predicted";

const rates = profileRates(DEFAULT_PROFILE);
const node = (o: Partial<PredictedNode> = {}): PredictedNode => ({ rates, prefillTokens: 0, prefillRequests: 0, waiting: null, decoding: 0, ...o });
const P = (id: string, o: Partial<PredictedNode> = {}, uncached = 4000, prompt = 4000): PredictedCandidate => ({
  id,
  group: id,
  node: node(o),
  size: { promptTokens: prompt, uncachedTokens: uncached },
});
const D = (id: string, o: Partial<PredictedNode> = {}, uncached = 4000, prompt = 4000, extra: Partial<DecodeCandidate> = {}): DecodeCandidate => ({
  ...P(id, o, uncached, prompt),
  localPrefill: false,
  kvUsage: null,
  kvCapacityTokens: null,
  ...extra,
});

describe("predicted TTFT (pure)", () => {
  it("a prefill costs its uncached tokens at the node's rate, more at a longer context", () => {
    // 10,000 tokens/s: 1,000 cold tokens are 100 ms and a bit of attention over themselves
    expect(prefillDoneMs(node(), { promptTokens: 1000, uncachedTokens: 1000 })).toBeCloseTo(100 * (1 + 500 / ATTENTION_CONTEXT_TOKENS));
    // the same 1,000 tokens after 20,000 cached ones cost about three times as much
    const late = prefillDoneMs(node(), { promptTokens: 21_000, uncachedTokens: 1000 });
    expect(late / 100).toBeCloseTo(1 + 20_500 / ATTENTION_CONTEXT_TOKENS);
  });

  it("grows with the work queued on the node, its own and what the engine says waits beyond it", () => {
    fc.assert(
      fc.property(fc.nat(100_000), fc.nat(50), fc.integer({ min: 1, max: 50_000 }), (queued, waiting, prompt) => {
        const size = { promptTokens: prompt, uncachedTokens: prompt };
        const idle = prefillDoneMs(node(), size);
        expect(prefillDoneMs(node({ prefillTokens: queued, prefillRequests: 1 }), size)).toBeGreaterThanOrEqual(idle);
        // waiting requests the router sent are already in its prefill tokens: only those beyond count
        expect(prefillDoneMs(node({ prefillTokens: queued, prefillRequests: 50, waiting }), size)).toBeCloseTo(
          prefillDoneMs(node({ prefillTokens: queued, prefillRequests: 50 }), size),
        );
        expect(prefillDoneMs(node({ waiting: waiting + 1 }), size)).toBeGreaterThan(idle);
      }),
    );
  });

  it("prices the prefills running on a node at their own context, not this request's", () => {
    // an 80k-token cold prompt prefilling ahead: its cost (leases.ts prefillCostOf) at 10,000 tokens/s
    const cost = 80_000 * (1 + 40_000 / ATTENTION_CONTEXT_TOKENS);
    const short = { promptTokens: 500, uncachedTokens: 500 };
    const own = prefillDoneMs(node(), short);
    expect(prefillDoneMs(node({ prefillTokens: 80_000, prefillRequests: 1, prefillCost: cost }), short) - own).toBeCloseTo(cost / 10);
    // without a cost the tokens count at this request's context (a short cold one: barely more than their count)
    expect(prefillDoneMs(node({ prefillTokens: 80_000, prefillRequests: 1 }), short) - own).toBeCloseTo(8_000);
    // D's queue too: a pair whose D runs that prefill waits for it (FCFS), at its cost
    const onD = { promptTokens: 500, uncachedTokens: 500 };
    const busyD = remoteTtftMs(node(), short, node({ prefillTokens: 80_000, prefillRequests: 1, prefillCost: cost }), onD);
    expect(busyD).toBeGreaterThanOrEqual(cost / 10);
    // waiting requests the router did not send are still sized and priced at this request's context
    const waitingOnly = prefillDoneMs(node({ prefillCost: 0, waiting: 1 }), { promptTokens: 21_000, uncachedTokens: 1_000 });
    const alone = prefillDoneMs(node(), { promptTokens: 21_000, uncachedTokens: 1_000 });
    expect(waitingOnly - alone).toBeCloseTo(21_000 * 0.1 * (1 + 20_000 / ATTENTION_CONTEXT_TOKENS));
  });

  it("P then D pays the transfer of what D lacks and D's step; D's own queue delays it only past P's prefill", () => {
    const onP = { promptTokens: 8000, uncachedTokens: 8000 };
    const warmD = { promptTokens: 8000, uncachedTokens: 0 };
    const coldD = { promptTokens: 8000, uncachedTokens: 8000 };
    expect(remoteTtftMs(node(), onP, node(), coldD)).toBeGreaterThan(remoteTtftMs(node(), onP, node(), warmD));
    // a D that lacks nothing still pays its hand-off (one step in a profile) and its first step
    expect(remoteTtftMs(node(), onP, node(), warmD)).toBeCloseTo(prefillDoneMs(node(), onP) + rates.handoffMs + rates.decodeStepMs);
    const shortQueue = node({ prefillTokens: 100, prefillRequests: 1 });
    expect(remoteTtftMs(node(), onP, shortQueue, warmD)).toBeCloseTo(remoteTtftMs(node(), onP, node(), warmD));
    const longQueue = node({ prefillTokens: 200_000, prefillRequests: 20 });
    expect(remoteTtftMs(node(), onP, longQueue, warmD)).toBeGreaterThan(remoteTtftMs(node(), onP, node(), warmD) * 2);
  });

  it("a waiting request the router did not send is sized as the sequences the node decodes (their mean prompt), else as this prompt", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 30 }),
        fc.integer({ min: 1, max: 20 }),
        fc.integer({ min: 1, max: 100_000 }),
        fc.integer({ min: 1, max: 100_000 }),
        (waiting, decoding, mean, prompt) => {
          const size = { promptTokens: prompt, uncachedTokens: prompt };
          const busy = node({ waiting, decoding, decodingTokens: decoding * mean });
          expect(waitingSizeOf(busy, size)).toBeCloseTo(mean);
          expect(queuedTokens(busy, size)).toBeCloseTo(waiting * mean);
          // nothing decoding there (or not known): each is taken as this prompt
          expect(queuedTokens(node({ waiting, decodingTokens: 0 }), size)).toBe(waiting * prompt);
          expect(queuedTokens(node({ waiting, decoding }), size)).toBe(waiting * prompt);
          // on a decode-only node they are pulls of that size
          const pulls = node({ waiting, decoding, decodingTokens: decoding * mean, decodeOnly: true });
          expect(prefillDoneMs(pulls, size) - prefillDoneMs(node(), size)).toBeCloseTo(waiting * mean * rates.transferMsPerToken, 6);
        },
      ),
    );
  });

  it("on a decode-only node, a waiting request the router did not send is a KV pull ahead (its transfer), not a prompt to prefill", () => {
    const size = { promptTokens: 8000, uncachedTokens: 8000 };
    const waiting = node({ waiting: 10, decodeOnly: true });
    const asPrefills = node({ waiting: 10 });
    // ten pulls of this prompt's size on D's link, against ten prefills of it
    expect(prefillDoneMs(waiting, size) - prefillDoneMs(node(), size)).toBeCloseTo(10 * 8000 * rates.transferMsPerToken);
    expect(prefillDoneMs(asPrefills, size) - prefillDoneMs(node(), size)).toBeCloseTo(10 * 8000 * rates.prefillMsPerToken);
    // D's part of a pair: its queue is those pulls, and still delays the first token past P's prefill when long
    const onP = { promptTokens: 8000, uncachedTokens: 8000 };
    const warmD = { promptTokens: 8000, uncachedTokens: 0 };
    const manyPulls = node({ waiting: 2000, decodeOnly: true });
    expect(remoteTtftMs(node(), onP, manyPulls, warmD)).toBeCloseTo(2000 * 8000 * rates.transferMsPerToken + rates.decodeStepMs);
    // the router's own prefills on D (local prefills) are prefill work there whatever the role
    const localOnD = node({ prefillTokens: 50_000, prefillRequests: 5, waiting: 5, decodeOnly: true });
    expect(prefillDoneMs(localOnD, size) - prefillDoneMs(node(), size)).toBeCloseTo(50_000 * rates.prefillMsPerToken);
  });

  it("a local prefill harms each sequence decoding there by its own prefill time", () => {
    const size = { promptTokens: 2000, uncachedTokens: 1000 };
    expect(localPrediction(node(), size).harmMs).toBe(0);
    const busy = localPrediction(node({ decoding: 12 }), size);
    expect(busy.harmMs).toBeCloseTo(12 * (busy.ttftMs - rates.decodeStepMs));
  });

  it("KV room for the whole prompt: below kvBusy with it; unknown capacity never refuses", () => {
    expect(hasKvRoom(0.5, 10_000, 3000, 0.9)).toBe(true);
    expect(hasKvRoom(0.5, 10_000, 4000, 0.9)).toBe(false);
    expect(hasKvRoom(null, 10_000, 1e9, 0.9)).toBe(true);
    expect(hasKvRoom(0.95, null, 1, 0.9)).toBe(true);
  });
});

describe("the predicted choice (pure)", () => {
  it("keeps the policies' pair while nothing is predicted faster by the margin", () => {
    const answer = choosePredicted({ prefills: [P("p0"), P("p1", {}, 3900)], decodes: [D("d0"), D("d1")], sameGroup: false, kvBusy: 0.9 })!;
    expect(answer.choice).toMatchObject({ mode: "disaggregated", prefill: "p0", decode: "d0" });
  });

  it("passes over a D with a long prefill queue for one predicted faster, though the first holds more of the prompt", () => {
    const queued = { prefillTokens: 100_000, prefillRequests: 10 };
    const answer = choosePredicted({ prefills: [P("p0")], decodes: [D("d0", queued, 0), D("d1", {}, 4000)], sameGroup: false, kvBusy: 0.9 })!;
    expect(answer.choice).toMatchObject({ mode: "disaggregated", decode: "d1" });
    expect(answer.figures.decode.get("d0")!.predictedTtftMs).toBeGreaterThan(answer.figures.decode.get("d1")!.predictedTtftMs);
  });

  it("prefills on D when P is queued, unless D lacks KV room for the whole prompt", () => {
    const q = (kvUsage: number) => ({
      prefills: [P("p0", { prefillTokens: 200_000, prefillRequests: 20 })],
      decodes: [D("d0", {}, 500, 6000, { localPrefill: true, kvUsage, kvCapacityTokens: 10_000 })],
      sameGroup: false,
      kvBusy: 0.9,
    });
    expect(choosePredicted(q(0.1))!.choice).toMatchObject({ mode: "local", decode: "d0" });
    const refused = choosePredicted(q(0.5))!;
    expect(refused.choice).toMatchObject({ mode: "disaggregated", prefill: "p0", decode: "d0" });
    expect(refused.figures.decode.get("d0")!.localTtftMs).toBeNull();
  });

  it("on `both` nodes a P that decodes pays the decode harm of its prefill too: the warm node prefills alone rather than a cold node beside its sequences", () => {
    // both-8: x holds 6,000 of the 8,000 tokens; y is cold. Both decode 20 sequences.
    const x = { prefillTokens: 0, decoding: 20 };
    const y = { decoding: 20 };
    const q = (yDecoding: number) => ({
      prefills: [P("y", { ...y, decoding: yDecoding }, 8000, 8000), P("x", x, 2000, 8000)],
      decodes: [D("x", x, 2000, 8000, { localPrefill: true }), D("y", { ...y, decoding: yDecoding }, 8000, 8000, { localPrefill: true })],
      sameGroup: false,
      kvBusy: 0.9,
    });
    const both = choosePredicted(q(20))!;
    expect(both.choice).toMatchObject({ mode: "local", decode: "x" });
    // the same cold P prefilling beside no sequence (a prefill-only node) is free of harm: x's
    // local prefill (2,000 tokens at 6,000 of context, x 20 sequences) is worse than y then x
    const idle = choosePredicted(q(0))!;
    expect(idle.choice).toMatchObject({ mode: "disaggregated", prefill: "y", decode: "x", harmMs: 0 });
    // /v1/route shows a P's harm beside its figure
    expect(both.figures.prefill.get("y")!.decodeHarmMs).toBeCloseTo(prefillHarmMs(P("y", y, 8000, 8000).node, { promptTokens: 8000, uncachedTokens: 8000 }));
  });

  it("prices the decode steps a new sequence lengthens: a warm D crowded with sequences loses to a cold one with few, unless nothing says how long requests decode", () => {
    // 1 ms a further sequence in a step, requests decode 400 tokens: on d0 (30 decoding) this one's
    // 400 steps take 30 ms more each and it adds 1 ms to each of 30 sequences' steps, 20 s summed
    // over d1 (5 decoding); d1 lacks the whole prompt: ~105 ms of transfer
    const q = (decodeTokens: number, decodeOnly = true) => {
      const r = { ...rates, decodeMsPerSeq: 1, decodeTokens };
      const decodes = [D("d0", { rates: r, decoding: 30, decodeOnly }, 0, 8000), D("d1", { rates: r, decoding: 5, decodeOnly }, 8000, 8000)];
      return { prefills: [P("p0")], decodes, sameGroup: false, kvBusy: 0.9 };
    };
    const priced = choosePredicted(q(400))!;
    expect(priced.choice).toMatchObject({ mode: "disaggregated", decode: "d1" });
    expect(priced.figures.decode.get("d0")!.decodeLoadMs).toBeCloseTo(400 * 2 * (30 - 5));
    expect(priced.figures.decode.get("d1")!.decodeLoadMs).toBeUndefined();
    // TTFT alone: the warm d0 (no transfer) is the faster, and the policies' pick
    expect(choosePredicted(q(0))!.choice).toMatchObject({ mode: "disaggregated", decode: "d0" });
    // Ds that are also Ps (`both` nodes): their sequences are priced by the decode harm alone
    const unpriced = choosePredicted(q(400, false))!;
    expect(unpriced.choice).toMatchObject({ mode: "disaggregated", decode: "d0" });
    expect(unpriced.figures.decode.get("d0")!.decodeLoadMs).toBeUndefined();
  });

  it("prices the decode load at the candidate Ds' mean ms a sequence: a D whose learned growth came out higher is not avoided for it, only for the sequences it decodes", () => {
    // d0 and d1 decode alike (10 sequences each), but d0's fitted growth came out 3x d1's (one
    // node's noise): each D is warm for half the prompt, d0 a little more
    const q = (decodingD1: number) => {
      const d0 = D("d0", { rates: { ...rates, decodeMsPerSeq: 1.5, decodeTokens: 400 }, decoding: 10, decodeOnly: true }, 3000, 8000);
      const d1 = D("d1", { rates: { ...rates, decodeMsPerSeq: 0.5, decodeTokens: 400 }, decoding: decodingD1, decodeOnly: true }, 4000, 8000);
      return { prefills: [P("p0")], decodes: [d0, d1], sameGroup: false, kvBusy: 0.9 };
    };
    const alike = choosePredicted(q(10))!;
    expect(alike.figures.decode.get("d0")!.decodeLoadMs).toBeUndefined();
    expect(alike.figures.decode.get("d1")!.decodeLoadMs).toBeUndefined();
    expect(alike.choice).toMatchObject({ decode: "d0" });
    // d1 decoding 5 more: priced at the mean 1 ms a sequence, 400 x 2 x 1 x 5 = 4 s over d0
    expect(choosePredicted(q(15))!.figures.decode.get("d1")!.decodeLoadMs).toBeCloseTo(400 * 2 * 1 * 5);
  });

  it("`both` nodes that both policies rank first: their own pick is that node alone, kept unless beaten by the margin", () => {
    // cold everywhere, nothing decoding: x alone is ~8% faster than y then x (no transfer), under the margin
    const q = (prefillOrder: string[]) => ({
      prefills: prefillOrder.map((id) => P(id, {}, 8000, 8000)),
      decodes: [D("x", {}, 8000, 8000, { localPrefill: true }), D("y", {}, 8000, 8000, { localPrefill: true })],
      sameGroup: false,
      kvBusy: 0.9,
    });
    expect(choosePredicted(q(["x", "y"]))!.choice).toMatchObject({ mode: "local", decode: "x" });
    // the prefill policy put y first: the policies' pick is y then x, and x alone does not beat it by 20%
    expect(choosePredicted(q(["y", "x"]))!.choice).toMatchObject({ mode: "disaggregated", prefill: "y", decode: "x" });
    // a pool of `both` nodes: the decode policy's first D alone is the pick whatever the prefill policy ranks first
    expect(choosePredicted({ ...q(["y", "x"]), allBoth: true })!.choice).toMatchObject({ mode: "local", decode: "x" });
  });

  it("on a pool of `both` nodes the decode policy's first D alone keeps a request another node would take only for less harm, and yields to a node alone predicted faster by the margin", () => {
    // x holds 6,000 of the 8,000 tokens and decodes 20 sequences; y is cold and decodes none
    const q = (xQueued: number, allBoth = true) => {
      const x = { decoding: 20, prefillTokens: xQueued, prefillRequests: xQueued > 0 ? 1 : 0 };
      return {
        prefills: [P("x", x, 2000, 8000), P("y", {}, 8000, 8000)],
        decodes: [D("x", x, 2000, 8000, { localPrefill: true }), D("y", {}, 8000, 8000, { localPrefill: true })],
        sameGroup: false,
        kvBusy: 0.9,
        allBoth,
      };
    };
    // scored by TTFT plus harm, y alone (no sequence to slow) wins over x alone (20 of them): the
    // request leaves the node holding its prefix and recomputes it
    expect(choosePredicted(q(0, false))!.choice).toMatchObject({ mode: "local", decode: "y", harmMs: 0 });
    // on a pool of `both` nodes that is no reason to move: y alone is predicted slower
    const kept = choosePredicted(q(0))!;
    expect(kept.choice).toMatchObject({ mode: "local", decode: "x" });
    expect(kept.figures.decode.get("y")!.predictedTtftMs).toBeGreaterThan(kept.choice.ttftMs);
    // x has 30,000 tokens of prefill queued ahead: y alone is predicted faster by more than the
    // margin, and takes it alone — not y then x, which waits for x's queue all the same
    const moved = choosePredicted(q(30_000))!;
    expect(moved.choice).toMatchObject({ mode: "local", decode: "y" });
    expect(moved.choice.ttftMs).toBeLessThan(moved.figures.decode.get("x")!.localTtftMs! * (1 - STICKY_MARGIN));
    // when x may not prefill alone (no KV room for the whole prompt) the policies' pair is the
    // incumbent, as on any pool: y prefills, x decodes
    const full = choosePredicted({ ...q(0), decodes: q(0).decodes.map((d) => (d.id === "x" ? { ...d, kvUsage: 0.85, kvCapacityTokens: 100_000 } : d)) })!;
    expect(full.choice).toMatchObject({ mode: "disaggregated", prefill: "y", decode: "x" });
  });

  it("a split between `both` nodes pays D's hand-off: priced one of D's steps before D has pulled, a short prompt stays on D alone", () => {
    // x and y decode nothing; x's step was learned at 20 ms, y's at 30. A 200-token cold prompt:
    // the decode policy put x first, the prefill policy y, so their own pick is y then x
    const q = (handoffMs: number) => {
      const x = { rates: { ...rates, decodeStepMs: 20, handoffMs } };
      const y = { rates: { ...rates, decodeStepMs: 30, handoffMs } };
      return {
        prefills: [P("y", y, 200, 200), P("x", x, 200, 200)],
        decodes: [D("x", x, 200, 200, { localPrefill: true }), D("y", y, 200, 200, { localPrefill: true })],
        sameGroup: false,
        kvBusy: 0.9,
      };
    };
    // with no hand-off the split looks within 20% of x alone (x's shorter step either way): kept
    expect(choosePredicted(q(0))!.choice).toMatchObject({ mode: "disaggregated", prefill: "y", decode: "x" });
    // with one of x's steps of hand-off x alone beats it by the margin
    const priced = choosePredicted(q(20))!;
    expect(priced.choice).toMatchObject({ mode: "local", decode: "x" });
    expect(priced.figures.prefill.get("y")!.predictedTtftMs - priced.choice.ttftMs).toBeGreaterThan(20);
    // a node with no learned rates is priced its profile's step of hand-off
    expect(rates.handoffMs).toBe(DEFAULT_PROFILE.decodeStepMs);
  });

  it("never pairs a node with itself, keeps pairs in one group when asked, and picks the lowest score beyond the margin (property)", () => {
    const arbNode = fc.record({
      prefillTokens: fc.nat(100_000),
      prefillRequests: fc.nat(10),
      decoding: fc.nat(30),
      rates: fc.constant({ ...rates, decodeMsPerSeq: 0.5 }),
      decodeOnly: fc.boolean(),
    });
    fc.assert(
      fc.property(
        fc.array(fc.tuple(fc.constantFrom("a", "b", "c", "d"), arbNode, fc.nat(8000), fc.boolean(), fc.constantFrom("g1", "g2")), { minLength: 1, maxLength: 6 }),
        fc.boolean(),
        (spec, sameGroup) => {
          const unique = [...new Map(spec.map((s) => [s[0], s])).values()];
          const prefills = unique.map(([id, o, uncached, , group]) => ({ ...P(id, o, uncached, 8000), group }));
          const decodes = unique.map(([id, o, uncached, local, group]) => ({ ...D(id, o, uncached, 8000, { localPrefill: local }), group }));
          const answer = choosePredicted({ prefills, decodes, sameGroup, kvBusy: 0.9 });
          if (answer === null) {
            // no option: every pair would be a node with itself (or across groups) and no D may prefill alone
            expect(decodes.every((d) => !d.localPrefill)).toBe(true);
            return;
          }
          const c = answer.choice;
          if (c.mode === "disaggregated") {
            expect(c.prefill).not.toBe(c.decode);
            if (sameGroup) expect(prefills.find((p) => p.id === c.prefill)!.group).toBe(decodes.find((d) => d.id === c.decode)!.group);
          } else expect(decodes.find((d) => d.id === c.decode)!.localPrefill).toBe(true);
          // brute force: no option scores below the choice by more than the margin (decode load over the least loaded D's)
          // (priced only when every D is decode-only)
          const perSeq = decodes.reduce((sum, d) => sum + d.node.rates.decodeMsPerSeq, 0) / decodes.length;
          const load = (d: DecodeCandidate) => (decodes.every((x) => x.node.decodeOnly) ? decodeLoadMs(d.node, perSeq) : 0);
          const least = Math.min(...decodes.map(load));
          const scores = decodes.flatMap((d) => [
            ...prefills
              .filter((p) => p.id !== d.id && (!sameGroup || p.group === d.group))
              .map((p) => remoteTtftMs(p.node, p.size, d.node, d.size) + prefillHarmMs(p.node, p.size) + load(d) - least),
            ...(d.localPrefill ? [localPrediction(d.node, d.size)].map((l) => l.ttftMs + l.harmMs + load(d) - least) : []),
          ]);
          const score = c.ttftMs + c.harmMs;
          expect(score * (1 - STICKY_MARGIN)).toBeLessThanOrEqual(Math.min(...scores) + 1e-6);
        },
      ),
    );
  });
});
