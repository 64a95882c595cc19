import { describe, expect, it } from "vitest";
import { localPrefillOf, parseClusterDocument } from "../../src/config/schema";
import { withoutFileEngines } from "./helpers";

withoutFileEngines();

// SPEC 8's per-request decision in the cluster document: policy.disaggregation and its
// thresholds, and the node field localPrefill (who may prefill alone as a decode node).

const nodes = [
  { id: "p0", url: "http://10.0.0.1:8100", role: "prefill" },
  { id: "d0", url: "http://10.0.0.2:8200", role: "decode" },
];
const parse = (doc: Record<string, unknown>) => parseClusterDocument({ nodes, ...doc });
const problems = (doc: Record<string, unknown>) => {
  const r = parse(doc);
  return r.ok ? [] : r.problems.map((p) => p.path);
};

describe("policy.disaggregation in the cluster document", () => {
  it("defaults to always, 2048 tokens and 0.7 (SPEC 8)", () => {
    const r = parse({});
    if (!r.ok) throw new Error(JSON.stringify(r.problems));
    expect(r.config.policy).toMatchObject({ disaggregation: "always", localPrefillTokens: 2048, localPrefillRatio: 0.7 });
  });

  it("names a bad value", () => {
    expect(problems({ policy: { disaggregation: "sometimes" } })).toEqual(["policy.disaggregation"]);
    expect(problems({ policy: { localPrefillTokens: -1 } })).toEqual(["policy.localPrefillTokens"]);
    expect(problems({ policy: { localPrefillRatio: 1.5 } })).toEqual(["policy.localPrefillRatio"]);
    expect(problems({ nodes: [nodes[0], { ...nodes[1], localPrefill: "yes" }] })).toEqual(["nodes[1].localPrefill"]);
  });
});

describe("localPrefill: who may prefill alone as a decode node", () => {
  it("defaults to true for vLLM decode-capable nodes, false for prefill nodes and under sglang", () => {
    expect(localPrefillOf({ role: "decode" }, "vllm")).toBe(true);
    expect(localPrefillOf({ role: "both" }, "vllm-mooncake")).toBe(true);
    expect(localPrefillOf({ role: "prefill" }, "vllm")).toBe(false);
    expect(localPrefillOf({ role: "decode" }, "sglang")).toBe(false);
    expect(localPrefillOf({ role: "decode", localPrefill: false }, "vllm")).toBe(false);
  });

  it("true under sglang makes the document invalid, naming the node", () => {
    expect(problems({ protocol: "sglang", nodes: [nodes[0], { ...nodes[1], localPrefill: true }] })).toEqual(["nodes[1].localPrefill"]);
    expect(problems({ protocol: "sglang", nodes: [nodes[0], { ...nodes[1], localPrefill: false }] })).toEqual([]);
  });
});
