import { afterEach, describe, expect, it, vi } from "vitest";
import type { CandidateNode, SelectionInput } from "../../../src/routing/types";
import { LOST_AFTER_MISSES } from "../../../src/state/cache-feedback";
import { PrefixMemory } from "../../../src/state/prefix-memory";
import { clusterView, decision, routeRequest, viewNode } from "./fixtures";

// What the router believes each node's prefix cache holds, and what the engines' answers teach it.

const HASHES = ["h1", "h2", "h3", "h4"];
const cand = (id: string) => ({ id }) as CandidateNode;
const input = (prefill: string[], decode: string[], fields: Partial<SelectionInput> = {}) =>
  ({ colocated: false, prefill: prefill.map(cand), decode: decode.map(cand), prefixMatches: { prefill: { p0: 3 }, decode: { d0: 1 } }, ...fields }) as SelectionInput;
const CACHE = { blockChars: 512, loadFactor: 3, shareFactor: 1.1, shareHalfLife: 1000, maxBlocksPerRequest: 3 };
const holders = (m: PrefixMemory, role: "prefill" | "decode", nodes: string[]) => m.index[role].match(HASHES, nodes);

afterEach(() => vi.restoreAllMocks());

describe("a routed request", () => {
  it("disaggregated: predicts what P holds; P and D hold the prompt now, each in its pool's index, up to maxBlocksPerRequest", () => {
    const m = new PrefixMemory(100);
    const prediction = m.routed(routeRequest({ prefixHashes: HASHES, promptChars: 2048 }), decision("p0", "d0"), input(["p0"], ["d0"]), CACHE);
    expect(prediction).toEqual({ node: "p0", role: "prefill", hashes: ["h1", "h2", "h3"], matched: 3, promptChars: 2048, blockChars: 512 });
    expect(holders(m, "prefill", ["p0", "d0"])).toEqual({ p0: 3, d0: 0 });
    expect(holders(m, "decode", ["p0", "d0"])).toEqual({ p0: 0, d0: 3 });
  });

  it("served by D alone (a local prefill, or colocated): predicts what D holds, and only D holds it", () => {
    for (const [d, inp] of [
      [decision("d0", "d0", { mode: "local", prefillRule: "local_prefill" }), input(["p0"], ["d0"])],
      [decision("d0", "d0", { mode: "colocated", prefillRule: "colocated" }), input([], ["d0"], { colocated: true })],
    ] as const) {
      const m = new PrefixMemory(100);
      expect(m.routed(routeRequest({ prefixHashes: HASHES }), d, inp, CACHE)).toMatchObject({ node: "d0", role: "decode", matched: 1 });
      expect(holders(m, "prefill", ["p0", "d0"])).toEqual({ p0: 0, d0: 0 });
      expect(holders(m, "decode", ["d0"])).toEqual({ d0: 3 });
    }
  });

  it("a node of role both has one cache: each pool's index learns it", () => {
    const m = new PrefixMemory(100);
    m.routed(routeRequest({ prefixHashes: HASHES }), decision("b0", "b0"), input(["b0"], ["b0"]), CACHE);
    expect(holders(m, "prefill", ["b0"])).toEqual({ b0: 3 });
    expect(holders(m, "decode", ["b0"])).toEqual({ b0: 3 });
  });
});

describe("an engine's answer", () => {
  const view = clusterView([viewNode("p0", "prefill"), viewNode("d0", "decode"), viewNode("b0", "both")]);
  const prediction = (node: string) => ({ node, role: "decode" as const, hashes: ["h1", "h2", "h3"], matched: 3, promptChars: 3 * 512, blockChars: 512 });

  it("teaches the node's characters per token (when the prompt's size is known)", () => {
    const m = new PrefixMemory(100);
    for (let i = 0; i < 20; i++) m.learn({ promptChars: 1_000 }, { node: "d0", promptTokens: 1_000, cachedTokens: 0 }, view);
    expect(m.rates.of("d0")).toBeLessThan(1.5);
    m.learn({ promptChars: 0 }, { node: "p0", promptTokens: 1_000, cachedTokens: 0 }, view);
    m.learn(undefined, { node: "p0", promptTokens: 1_000, cachedTokens: 0 }, view);
    expect(m.status("p0").charsPerToken).toBe(Math.round(m.rates.of("d0") * 1000) / 1000);
  });

  it("is counted against the prediction the lease kept, only from the node predicted for", () => {
    const m = new PrefixMemory(100);
    m.learn({ prediction: prediction("d0") }, { node: "d0", promptTokens: 400, cachedTokens: 256 }, view);
    m.learn({ prediction: prediction("d0") }, { node: "d1", promptTokens: 400, cachedTokens: 256 }, view);
    expect(m.status("d0")).toMatchObject({ predictedTokens: 384, cachedTokens: 256, cacheLost: 0 });
    expect(m.status("d1")).toMatchObject({ predictedTokens: 0, cachedTokens: 0 });
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
