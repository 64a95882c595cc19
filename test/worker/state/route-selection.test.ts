import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { prefillContextFactor } from "../../../src/routing/predict";
import type { CandidateNode } from "../../../src/routing/types";
import { onFailure } from "../../../src/state/health";
import { candidateOf, routeInput, slimDecision } from "../../../src/state/route-selection";
import { NodeHealthTable } from "../../../src/state/health-table";
import { clusterView, decision, HEALTH, modules, reading, routeRequest, viewNode, type ViewNode } from "./fixtures";
import { withoutFileEngines } from "../helpers";

withoutFileEngines();

// What the object gives the pure selection core for one request, from what its modules hold, and
// how the health table takes what it hears (legs that ended, probes, picks).

const ids = (nodes: CandidateNode[]) => nodes.map((n) => n.id);

describe("the pools a request is selected from", () => {
  const nodes = [viewNode("p0", "prefill"), viewNode("d0", "decode"), viewNode("b0", "both"), viewNode("x0", "decode", { models: ["other"] })];

  it("a node of role both is a candidate in each pool; a node that does not serve the model in none", () => {
    const input = routeInput(routeRequest({ model: "m" }), clusterView(nodes), 0, true, modules());
    expect(ids(input.prefill)).toEqual(["p0", "b0"]);
    expect(ids(input.decode)).toEqual(["d0", "b0"]);
  });

  it("a request without a model (SGLang's /generate) may go to any node", () => {
    const input = routeInput(routeRequest({ model: "" }), clusterView(nodes), 0, true, modules());
    expect(ids(input.decode)).toEqual(["d0", "b0", "x0"]);
  });

  it("colocated, or a one-hop request: no prefill pool", () => {
    for (const [view, req] of [
      [clusterView(nodes, { protocol: "colocated" }), routeRequest()],
      [clusterView(nodes), routeRequest({ oneHop: true })],
    ] as const) {
      const input = routeInput(req, view, 0, true, modules());
      expect(input.colocated).toBe(true);
      expect(input.prefill).toEqual([]);
      expect(ids(input.decode)).toEqual(["d0", "b0"]);
    }
  });

  it("are what filtering the nodes by model and role gives, in document order (property)", () => {
    const arbNode = fc.record({ role: fc.constantFrom("prefill", "decode", "both"), models: fc.option(fc.subarray(["m", "n"]), { nil: undefined }) });
    fc.assert(
      fc.property(fc.array(arbNode, { maxLength: 12 }), fc.constantFrom("m", "n", ""), fc.boolean(), (specs, model, colocated) => {
        const view = clusterView(
          specs.map((s, i) => viewNode(`n${i}`, s.role as ViewNode["role"], { models: s.models })),
          { protocol: colocated ? "colocated" : "vllm" },
        );
        const input = routeInput(routeRequest({ model }), view, 0, true, modules());
        const serves = (n: ViewNode) => !n.models || !model || n.models.includes(model);
        const pool = (role: "prefill" | "decode") => view.nodes.filter((n) => serves(n) && (n.role === role || n.role === "both")).map((n) => n.id);
        expect(ids(input.prefill)).toEqual(colocated ? [] : pool("prefill"));
        expect(ids(input.decode)).toEqual(pool("decode"));
      }),
    );
  });
});

describe("a candidate as the modules see it", () => {
  it("carries its lease load, health, fresh signals, learned rate and recent share in its role", () => {
    const m = modules();
    m.health.sync(new Set(["p0", "d0"]));
    m.leases.take("a", { prefill: "p0", decode: "d0", tokens: 700, prefillTokens: 300, expiresAt: 1e9, route: "r", fallbacks: { prefill: [], decode: [] }, model: "m" });
    m.signals.record("d0", reading({ kvUsage: 0.5, waiting: 2, kvCapacityTokens: 1_000 }), 0);
    m.recent.count("p0", "d0", 100, 300, 700);
    for (let i = 0; i < 10; i++) m.prefixes.rates.observe("d0", 2_000, 1_000);
    onFailure(m.health.get("d0")!, 50, HEALTH);
    const d = candidateOf(viewNode("d0", "decode", { group: "g1", localPrefill: true }), "decode", 100, 15_000, m);
    expect(d).toMatchObject({ id: "d0", group: "g1", load: 1, work: 700, healthy: true, lastFailureAt: 50, localPrefill: true, recentRequests: 1 });
    expect(d.recent).toBeCloseTo(700);
    // learned from its answers (about 2.3 after ten at 2, the prior still weighing), not the default 4
    expect(d.charsPerToken).toBe(m.prefixes.rates.of("d0"));
    expect(d.charsPerToken).toBeLessThan(2.5);
    // KV use: the reading (0.5), but never below the decode lease the router holds there (700 of 1,000)
    expect(d.signals).toEqual({ kvUsage: 0.7, queue: 2, ageMs: 100, kvCapacityTokens: 1_000, reported: reading({ kvUsage: 0.5, waiting: 2, kvCapacityTokens: 1_000 }) });
    const p = candidateOf(viewNode("p0", "prefill"), "prefill", 100, 15_000, m);
    expect(p).toMatchObject({ group: "node:p0", load: 1, work: 300, localPrefill: false, signals: null });
    // its prefill's cost at its own context (400 cached before its 300 uncached: predicted TTFT's queue)
    expect(p.prefillTokens).toBe(300);
    expect(p.prefillCost).toBeCloseTo(300 * prefillContextFactor(400 + 150));
  });

  it("signals older than staleMs are none (selection falls back to leases)", () => {
    const m = modules();
    m.signals.record("d0", reading(), 0);
    expect(candidateOf(viewNode("d0", "decode"), "decode", 15_000, 15_000, m).signals).not.toBeNull();
    expect(candidateOf(viewNode("d0", "decode"), "decode", 15_001, 15_000, m).signals).toBeNull();
  });

  it("a node the health table has not seen yet counts as healthy", () => {
    expect(candidateOf(viewNode("new", "decode"), "decode", 0, 15_000, modules()).healthy).toBe(true);
  });
});

describe("what else selection is given", () => {
  const nodes = [viewNode("p0", "prefill"), viewNode("d0", "decode")];
  const hashes = ["h1", "h2", "h3"];
  const remembered = () => {
    const m = modules();
    m.prefixes.index.prefill.record(hashes, "p0");
    m.prefixes.index.decode.record(hashes.slice(0, 2), "d0");
    return m;
  };

  it("cache_aware: each pool's prefix matches from the index", () => {
    const input = routeInput(routeRequest({ prefixHashes: hashes }), clusterView(nodes, {}, { prefill: "cache_aware" }), 0, true, remembered());
    expect(input.prefixMatches).toEqual({ prefill: { p0: 3 }, decode: { d0: 2 } });
    expect(input.prefixBlockCount).toBe(3);
  });

  it("conditional disaggregation asks what D holds whatever the policy; colocated it does not", () => {
    const conditional = { disaggregation: "conditional" as const };
    expect(routeInput(routeRequest({ prefixHashes: hashes }), clusterView(nodes, {}, conditional), 0, true, remembered()).prefixMatches.decode).toEqual({ d0: 2 });
    const colocated = clusterView(nodes, { protocol: "colocated" }, conditional);
    expect(routeInput(routeRequest({ prefixHashes: hashes }), colocated, 0, true, remembered()).prefixMatches).toEqual({ prefill: {}, decode: {} });
  });

  it("no prefix policy: no lookup", () => {
    expect(routeInput(routeRequest({ prefixHashes: hashes }), clusterView(nodes), 0, true, remembered()).prefixMatches).toEqual({ prefill: {}, decode: {} });
  });

  it("the decode KV guard from signals.* unless unguarded; the key's sticky pair; the cursors; the prompt's size", () => {
    const m = modules();
    m.sticky.remember("k", { prefill: "p0", decode: "d0" });
    m.cursors.set({ prefill: 4, decode: 7 });
    const view = clusterView(nodes, { signals: { intervalMs: 5_000, staleMs: 15_000, kvBusy: 0.8, queueBusy: 3 } });
    const input = routeInput(routeRequest({ key: "k", pinned: true, promptChars: 4096 }), view, 0, true, m);
    expect(input).toMatchObject({
      guard: { kvBusy: 0.8, queueBusy: 3 },
      sticky: { prefill: "p0", decode: "d0" },
      pinned: true,
      cursors: { prefill: 4, decode: 7 },
      promptChars: 4096,
    });
    expect(routeInput(routeRequest({ key: "other" }), view, 0, false, m)).toMatchObject({ guard: null, sticky: null, pinned: false, promptChars: 0 });
  });
});

describe("what the Worker is answered", () => {
  it("the picks, without the candidates and the fallbacks (the lease keeps those)", () => {
    const full = decision("p0", "d0", { fallbacks: { prefill: ["p1"], decode: ["d1"] } });
    full.decode.candidates = [{ id: "d0", load: 0, healthy: true, drain: false, group: "g" }];
    const slim = slimDecision(full);
    expect(slim.prefill).toEqual({ id: "p0", rule: "round_robin", failOpen: false, candidates: [], fallbacks: [] });
    expect(slim.decode.candidates).toEqual([]);
    expect(slim.decode.fallbacks).toEqual([]);
    expect({ ...slim, prefill: null, decode: null }).toEqual({ ...full, prefill: null, decode: null });
    expect(full.decode.fallbacks).toEqual(["d1"]);
  });
});

const table = (...ids: string[]) => {
  const t = new NodeHealthTable();
  t.sync(new Set(ids));
  return t;
};
const fail = (t: NodeHealthTable, node: string, now: number, times = 1) => {
  for (let i = 0; i < times; i++) t.report({ node, outcome: "failure" }, now, HEALTH);
};

describe("the health table", () => {
  it("a failover target must be listed and healthy", () => {
    const t = table("d0", "d1");
    fail(t, "d1", 0, HEALTH.ejectAfter);
    expect(t.mayTake("d0", 10)).toBe(true);
    expect(t.mayTake("d1", 10)).toBe(false);
    expect(t.mayTake("unknown", 10)).toBe(false);
  });

  it("an ejected node past its ejection lets one trial through; its success closes the breaker", () => {
    const t = table("d0");
    fail(t, "d0", 0, HEALTH.ejectAfter);
    const after = HEALTH.ejectBaseMs + 1;
    expect(t.mayTake("d0", after)).toBe(true);
    t.picked("d0", after);
    expect(t.mayTake("d0", after)).toBe(false);
    t.report({ node: "d0", outcome: "ok" }, after, HEALTH);
    expect(t.view("d0")).toMatchObject({ failureStreak: 0, ejectedUntil: 0, trialInFlight: false });
  });

  it("a busy node (503/429) or an aborted leg tells nothing: the trial is freed, nothing counted", () => {
    const t = table("d0");
    fail(t, "d0", 0, HEALTH.ejectAfter);
    t.picked("d0", HEALTH.ejectBaseMs + 1);
    for (const outcome of ["busy", "aborted"] as const) t.report({ node: "d0", outcome }, HEALTH.ejectBaseMs + 2, HEALTH);
    expect(t.view("d0")).toMatchObject({ trialInFlight: false, failuresTotal: HEALTH.ejectAfter });
  });

  it("reports about unknown nodes, or without health settings, change nothing", () => {
    const t = table("d0");
    t.report({ node: "d0", outcome: "failure" }, 0, undefined);
    t.report({ node: "x", outcome: "failure" }, 0, HEALTH);
    t.picked("x", 0);
    expect(t.view("d0").failuresTotal).toBe(0);
    expect(t.get("x")).toBeUndefined();
  });

  it("a probe says when the node came back up after its probes failed (its cache is likely gone)", () => {
    const t = table("d0");
    const seen = [false, true, false, true, true, true].map((ok, i) => t.probed("d0", ok, i, { ...HEALTH, downAfter: 1, upAfter: 2 }));
    expect(seen).toEqual([false, false, false, false, true, false]);
    expect(t.probed("unknown", true, 0, HEALTH)).toBe(false);
  });
});
