import { describe, expect, it } from "vitest";
import fc from "fast-check";
import { AGENT_SESSION_HEADERS, affinityKey, affinityKeyMaterial, agentSessionOf, conversationKey } from "../../../src/routing/affinity-key";
import { sha256Hex } from "../../../src/routing/hash";
import { withoutFileEngines } from "../helpers";

withoutFileEngines();

const chat = (messages: unknown[], extra: Record<string, unknown> = {}) => ({ model: "m", messages, ...extra });
const key = (body: unknown, kind: "chat" | "completion" = "chat", sessionId?: string | null) => affinityKeyMaterial({ body, kind, sessionId });

describe("affinity key: which source decides", () => {
  it("takes the x-session-id header first, then body.user", () => {
    const body = chat([{ role: "user", content: "hi" }], { user: "u-1" });
    expect(key(body, "chat", "s-1")?.source).toBe("session");
    expect(key(body, "chat", "  ")?.source).toBe("user");
    expect(key(body, "chat", null)?.material).toBe("user\u0000u-1");
    expect(key(chat([{ role: "user", content: "hi" }], { user: "" }))?.source).toBe("chat_prefix");
  });

  it("prefixes the material with its source so sources never collide", () => {
    expect(key({ prompt: "x" }, "completion", "x")?.material).not.toBe(key({ prompt: "x" }, "completion")?.material);
    expect(key({ prompt: "x", user: "x" }, "completion")?.material).not.toBe(key({ prompt: "x" }, "completion")?.material);
  });

  it("has no key when nothing applies", () => {
    expect(key(chat([]))).toBeNull();
    expect(key(chat([{ role: "system", content: "you are helpful" }]))).toBeNull();
    expect(key({ prompt: "" }, "completion")).toBeNull();
    expect(key({ prompt: [] }, "completion")).toBeNull();
    expect(key("not an object", "chat")).toBeNull();
    expect(key(null, "completion")).toBeNull();
  });
});

describe("affinity key: the clients' own cache keys (SPEC 9)", () => {
  const body = (extra: Record<string, unknown> = {}) => chat([{ role: "user", content: "hi" }], { user: "u-1", ...extra });

  it("takes prompt_cache_key, then x-session-id, then an agent session header, then user", () => {
    const all = { body: body({ prompt_cache_key: "pck" }), kind: "chat" as const, sessionId: "s-1", agentSessionId: "a-1" };
    expect(affinityKeyMaterial(all)?.source).toBe("prompt_cache_key");
    expect(affinityKeyMaterial({ ...all, kind: "responses" })?.source).toBe("prompt_cache_key");
    expect(affinityKeyMaterial({ ...all, body: body() })?.source).toBe("session");
    expect(affinityKeyMaterial({ ...all, body: body(), sessionId: null })?.source).toBe("agent_session");
    expect(affinityKeyMaterial({ ...all, body: body(), sessionId: null, agentSessionId: " " })?.source).toBe("user");
    // an empty or non-string prompt_cache_key is no key
    expect(affinityKeyMaterial({ ...all, body: body({ prompt_cache_key: "" }) })?.source).toBe("session");
    expect(affinityKeyMaterial({ ...all, body: body({ prompt_cache_key: 7 }) })?.source).toBe("session");
  });

  it("hashes a client-chosen key with the API key's label: two tenants choosing one key get two keys, one tenant keeps its own", () => {
    fc.assert(
      fc.property(
        fc.string({ minLength: 1 }).filter((s) => s.trim() !== ""),
        fc.constantFrom("prompt_cache_key", "session", "agent"),
        (value, where) => {
          const input = (tenant: string | null) =>
            affinityKeyMaterial({
              body: body(where === "prompt_cache_key" ? { prompt_cache_key: value } : {}),
              kind: "chat",
              sessionId: where === "session" ? value : null,
              agentSessionId: where === "agent" ? value : null,
              tenant,
            })!.material;
          expect(input("tenant-a")).not.toBe(input("tenant-b"));
          expect(input("tenant-a")).toBe(input("tenant-a"));
          expect(input(null)).not.toBe(input("tenant-a"));
        },
      ),
    );
  });

  it("reads the documented agent session headers, most specific first", () => {
    const headers: Record<string, string> = { session_id: "codex", "x-claude-code-session-id": "claude" };
    expect(agentSessionOf((n) => headers[n])).toBe("claude");
    expect(agentSessionOf((n) => (n === "x-opencode-session" ? " oc " : undefined))).toBe("oc");
    expect(agentSessionOf(() => undefined)).toBeNull();
    expect(AGENT_SESSION_HEADERS).toContain("x-session-affinity");
  });
});

describe("affinity key: chat conversations", () => {
  const system = { role: "system", content: "You are a helpful assistant." };
  const first = { role: "user", content: "Tell me about Mooncake." };

  it("does not let a shared system prompt alone decide", () => {
    const a = key(chat([system, first]));
    const b = key(chat([system, { role: "user", content: "Something else" }]));
    expect(a?.material).not.toBe(b?.material);
  });

  it("includes the system prompt(s): same first message under different system prompts differs", () => {
    const a = key(chat([system, first]));
    const b = key(chat([{ role: "developer", content: "Be terse." }, first]));
    expect(a?.material).not.toBe(b?.material);
  });

  it("is stable across appended turns", () => {
    fc.assert(
      fc.property(fc.array(fc.record({ role: fc.constantFrom("user", "assistant", "system", "tool"), content: fc.string() })), (later) => {
        const base = key(chat([system, first]));
        expect(key(chat([system, first, { role: "assistant", content: "ok" }, ...later]))).toEqual(base);
      }),
    );
  });

  it("is the same for string content and text parts; non-text parts are ignored", () => {
    fc.assert(
      fc.property(fc.string({ minLength: 1 }), fc.string(), (userText, systemText) => {
        const plain = key(
          chat([
            { role: "system", content: systemText },
            { role: "user", content: userText },
          ]),
        );
        const parts = key(
          chat([
            { role: "system", content: [{ type: "text", text: systemText }] },
            {
              role: "user",
              content: [
                { type: "image_url", image_url: { url: "data:..." } },
                { type: "text", text: userText },
              ],
            },
          ]),
        );
        expect(parts).toEqual(plain);
      }),
    );
  });

  it("differs for different first user messages (sampled)", async () => {
    const seen = new Set<string>();
    for (let i = 0; i < 200; i++) {
      const found = await affinityKey({ body: chat([system, { role: "user", content: `question ${i}` }]), kind: "chat" });
      seen.add(found!.hash);
    }
    expect(seen.size).toBe(200);
  });

  it("has no key when the first user message has no text", () => {
    expect(key(chat([system, { role: "user", content: [{ type: "image_url", image_url: { url: "x" } }] }]))).toBeNull();
  });
});

describe("affinity key: completions", () => {
  it("uses the first 512 characters of a string prompt", () => {
    const long = "a".repeat(512);
    expect(key({ prompt: `${long}tail one` }, "completion")).toEqual(key({ prompt: `${long}tail two` }, "completion"));
    expect(key({ prompt: "b" + long }, "completion")).not.toEqual(key({ prompt: long }, "completion"));
  });

  it("uses the first prompt of a batch and the first 64 token ids of a token prompt", () => {
    expect(key({ prompt: ["one", "two"] }, "completion")).toEqual(key({ prompt: "one" }, "completion"));
    const tokens = Array.from({ length: 64 }, (_, i) => i);
    expect(key({ prompt: [...tokens, 1, 2] }, "completion")).toEqual(key({ prompt: [...tokens, 3] }, "completion"));
    expect(key({ prompt: [[...tokens, 9]] }, "completion")).toEqual(key({ prompt: tokens }, "completion"));
    expect(key({ prompt: [1, 2, 3] }, "completion")?.material).not.toBe(key({ prompt: "1,2,3" }, "completion")?.material);
  });
});

describe("affinityKey", () => {
  it("hashes the material with SHA-256", async () => {
    const input = { body: { prompt: "hello" }, kind: "completion" as const };
    const found = await affinityKey(input);
    expect(found).toEqual({ source: "prompt_prefix", hash: await sha256Hex(affinityKeyMaterial(input)!.material) });
    expect(found?.hash).toMatch(/^[0-9a-f]{64}$/);
    expect(await affinityKey({ body: {}, kind: "completion" })).toBeNull();
  });
});

describe("conversationKey: cache_aware keys a completions prompt deeper than a shared system prompt", () => {
  const prefixKey = { source: "prompt_prefix" as const, hash: "shared-by-every-request" };
  it("uses the chained hash of the first blocks instead of the first 512 characters", () => {
    expect(conversationKey(prefixKey, ["b0", "b1", "b2", "b3", "b4", "b5"])).toEqual({ source: "prompt_blocks", hash: "b3" });
    expect(conversationKey(prefixKey, ["b0", "b1"])).toEqual({ source: "prompt_blocks", hash: "b1" });
  });
  it("keeps the key when the prompt has no full block, and keys that already name the conversation", () => {
    expect(conversationKey(prefixKey, [])).toBe(prefixKey);
    const session = { source: "session" as const, hash: "s" };
    expect(conversationKey(session, ["b0", "b1"])).toBe(session);
    const chat = { source: "chat_prefix" as const, hash: "c" };
    expect(conversationKey(chat, ["b0"])).toBe(chat);
    expect(conversationKey(null, ["b0"])).toBeNull();
  });
});
