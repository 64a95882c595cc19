import { beforeEach, describe, expect, it } from "vitest";
import { post, putCluster, resetClusterState, resetSim, P3, D3 } from "./helpers";

// cache_aware on a router that has routed nothing yet (a new deployment, a new Durable Object):
// the share bound compares a node's share of recent requests with its weight's share, and on an
// empty history one request is already "all of it". A conversation's second turn must still find
// the node that holds its prefix (found in review: it moved off it without priming traffic).

const SYSTEM = "You are a careful assistant for an inference cluster. ".repeat(40);
const turn = (n: number) => {
  const messages: Array<{ role: string; content: string }> = [{ role: "system", content: SYSTEM }];
  for (let t = 0; t <= n; t++) {
    messages.push({ role: "user", content: `Question ${t}: why does my decode pool return 502? ${"details ".repeat(60)}` });
    if (t < n) messages.push({ role: "assistant", content: `Answer ${t}: check the decode pool's KV memory.` });
  }
  return { model: "sim-model", messages, max_tokens: 2 };
};

beforeEach(async () => {
  await resetSim();
  await resetClusterState();
  await putCluster({ protocol: "vllm", policy: { prefill: "cache_aware", decode: "cache_aware" }, nodes: [...P3, ...D3] });
});

describe("cache_aware on a fresh router", () => {
  it("keeps a conversation's turns on the P and D that hold its prefix, from the second request on", async () => {
    const placements: Array<[string | null, string | null]> = [];
    for (let t = 0; t < 4; t++) {
      const res = await post("/v1/chat/completions", turn(t));
      expect(res.status).toBe(200);
      await res.text();
      placements.push([res.headers.get("x-pd-prefill"), res.headers.get("x-pd-decode")]);
    }
    expect(new Set(placements.map((p) => p.join("/"))).size).toBe(1);
  });
});
