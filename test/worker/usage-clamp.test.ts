import { SELF } from "cloudflare:test";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { chat, expectNoLoad, fault, post, putCluster, resetClusterState, resetSim } from "./helpers";

// Issue 25 item 8: P's cached_tokens reach the client (D counts the KV it pulled as cached, so the
// router takes P's counts: SPEC 4). An engine, a patched build or a proxy that reports impossible
// figures must not pass them on: the client sees them clamped, and the node is counted for it.

const PD = [
  { id: "p0", role: "prefill" as const },
  { id: "d0", role: "decode" as const },
];

/** P's answer, as vLLM writes it, with the usage figures given (no kv_transfer_params: D prefills, still forwarded) */
const prefillAnswer = (usage: Record<string, unknown>) => ({
  mode: "respond",
  status: 200,
  headers: { "content-type": "application/json" },
  body: JSON.stringify({
    id: "cmpl-p",
    object: "chat.completion",
    model: "sim-model",
    choices: [{ index: 0, message: { role: "assistant", content: "x" }, finish_reason: "length" }],
    usage,
  }),
  count: 1,
});

const anomalies = async () => {
  const text = await (await SELF.fetch("http://router/metrics")).text();
  return Number(/^pd_router_node_usage_anomalies_total\{node="p0"\} (\d+)/m.exec(text)?.[1]);
};

describe("usage figures from P that cannot be true", () => {
  beforeEach(async () => {
    await resetSim();
    await resetClusterState();
  });
  afterEach(resetSim);

  it.each([
    ["cached tokens above the prompt (1e12)", { prompt_tokens: 12, completion_tokens: 1, total_tokens: 13, prompt_tokens_details: { cached_tokens: 1e12 } }, 12, 12],
    ["negative cached tokens (-5)", { prompt_tokens: 12, completion_tokens: 1, total_tokens: 13, prompt_tokens_details: { cached_tokens: -5 } }, 12, 0],
  ])("%s: the client sees them clamped to [0, prompt_tokens]; the node's anomaly is counted", async (_what, usage, prompt, cached) => {
    await putCluster({ protocol: "vllm", policy: { prefill: "round_robin", decode: "round_robin" }, nodes: PD });
    const before = await anomalies();
    await fault("p0", prefillAnswer(usage));
    const res = await post("/v1/chat/completions", chat("count my tokens"));
    expect(res.status).toBe(200);
    const body = (await res.json()) as { usage: { prompt_tokens: number; prompt_tokens_details: { cached_tokens: number }; completion_tokens: number; total_tokens: number } };
    expect(body.usage.prompt_tokens).toBe(prompt);
    expect(body.usage.prompt_tokens_details.cached_tokens).toBe(cached);
    expect(body.usage.total_tokens).toBe(prompt + body.usage.completion_tokens);
    await expectNoLoad();
    expect(await anomalies()).toBe((Number.isNaN(before) ? 0 : before) + 1);
  });
});
