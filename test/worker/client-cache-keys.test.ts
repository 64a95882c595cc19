// SPEC 9 through the Worker: the clients' own cache keys — `prompt_cache_key` in the body, then
// `x-session-id`, then the agent session headers — decide where a conversation goes, even when
// its turns share no first message (an agent that rewrites or compacts its history).
import { beforeEach, describe, expect, it } from "vitest";
import { post, putCluster, resetClusterState, resetSim, P3, D3 } from "./helpers";

/** Fixed keys and texts: a placement that fails fails every run. */
const KEYS = ["cache-a", "cache-b", "cache-c", "cache-d", "cache-e", "cache-f"];

const turn = (first: string, extra: Record<string, unknown> = {}) => ({
  model: "sim-model",
  messages: [
    { role: "system", content: "You are a coding agent." },
    { role: "user", content: first },
  ],
  max_tokens: 2,
  ...extra,
});

async function placed(path: string, body: unknown, headers: Record<string, string> = {}) {
  const res = await post(path, body, headers);
  const text = await res.text();
  expect(res.status, text).toBe(200);
  return `${res.headers.get("x-pd-prefill")}/${res.headers.get("x-pd-decode")}`;
}

beforeEach(async () => {
  await resetSim();
  await resetClusterState();
  await putCluster({ protocol: "vllm", policy: { prefill: "affinity", decode: "affinity" }, nodes: [...P3, ...D3] });
});

describe("prompt_cache_key keeps a conversation on its nodes", () => {
  it("two turns with different first messages and one prompt_cache_key land on one P and one D (chat and Responses)", async () => {
    for (const key of KEYS) {
      const first = await placed("/v1/chat/completions", turn(`Refactor module ${key}.`, { prompt_cache_key: key }));
      // the history was compacted: the first user message is new
      const second = await placed("/v1/chat/completions", turn(`Summary so far of ${key}: tests pass. Next step?`, { prompt_cache_key: key }));
      expect(second, key).toBe(first);
      const responses = await placed("/v1/responses", { model: "sim-model", input: `Another view of ${key}`, max_output_tokens: 2, prompt_cache_key: key });
      expect(responses, key).toBe(first);
    }
  });

  it("/v1/route names the key's source", async () => {
    const res = await post("/v1/route", turn("hello", { prompt_cache_key: "k" }), { "x-session-id": "s" });
    expect((await res.json<any>()).key.source).toBe("prompt_cache_key");
    const agent = await post("/v1/route", turn("hello"), { "x-claude-code-session-id": "cc-1" });
    expect((await agent.json<any>()).key.source).toBe("agent_session");
  });
});

describe("agent session headers keep a session on its nodes", () => {
  it("Claude Code's x-claude-code-session-id and Codex's session_id work like x-session-id", async () => {
    for (const [i, key] of KEYS.entries()) {
      const header = i % 2 === 0 ? "x-claude-code-session-id" : "session_id";
      const first = await placed("/v1/chat/completions", turn(`Task ${key}.`), { [header]: key });
      const second = await placed("/v1/chat/completions", turn(`Compacted ${key}, continue.`), { [header]: key });
      expect(second, `${header} ${key}`).toBe(first);
    }
  });
});
