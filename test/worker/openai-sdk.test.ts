import { SELF } from "cloudflare:test";
import OpenAI from "openai";
import { beforeAll, describe, expect, it } from "vitest";
import { control, putCluster, resetSim } from "./helpers";

// The official client, pointed at the router, as a user would: streaming and not, chat and completions.
const client = new OpenAI({ apiKey: "unused", baseURL: "http://router/v1", fetch: (input, init) => SELF.fetch(input as any, init as any) as any, maxRetries: 0 });

describe("the official openai client works against the router", () => {
  beforeAll(async () => {
    await resetSim();
    await putCluster({
      protocol: "vllm",
      policy: { prefill: "affinity", decode: "affinity" },
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "p1", role: "prefill" },
        { id: "d0", role: "decode" },
        { id: "d1", role: "decode" },
      ],
    });
  });

  it("chat, non-streaming", async () => {
    const out = await client.chat.completions.create({ model: "sim-model", messages: [{ role: "user", content: "Say hi" }], max_tokens: 5 });
    expect(out.choices[0]!.message.content).toBeTruthy();
    expect(out.usage?.completion_tokens).toBe(5);
  });

  it("chat, streaming with usage: P's prompt and cached tokens, D's completion tokens", async () => {
    /** prompt and cached tokens both P engines counted so far */
    const prefilled = async () => {
      const all = await Promise.all(["p0", "p1"].map((id) => control(`/engines/${id}/stats`)));
      return { prompt: all.reduce((n, s) => n + s.promptTokens, 0), cached: all.reduce((n, s) => n + s.cachedTokens, 0) };
    };
    // long enough to fill prefix blocks: the second time, its P finds them cached
    const content = "Count the words of this request, and then count them again. ".repeat(40);
    for (const turn of ["first", "again"]) {
      const before = await prefilled();
      const stream = await client.chat.completions.create({
        model: "sim-model",
        messages: [{ role: "user", content }],
        max_tokens: 6,
        stream: true,
        stream_options: { include_usage: true },
      });
      let text = "";
      let usage: OpenAI.CompletionUsage | null | undefined;
      for await (const chunk of stream) {
        text += chunk.choices[0]?.delta?.content ?? "";
        if (chunk.usage) usage = chunk.usage;
      }
      const after = await prefilled();
      expect(text.length).toBeGreaterThan(0);
      // the client's usage is what P prefilled and found cached (D pulled the rest), D's tokens
      expect({ turn, prompt: usage?.prompt_tokens, cached: usage?.prompt_tokens_details?.cached_tokens }).toEqual({
        turn,
        prompt: after.prompt - before.prompt,
        cached: after.cached - before.cached,
      });
      expect(usage?.completion_tokens).toBe(6);
      expect(usage?.total_tokens).toBe(usage!.prompt_tokens + 6);
      if (turn === "first") expect(usage?.prompt_tokens_details?.cached_tokens).toBe(0);
      else expect(usage?.prompt_tokens_details?.cached_tokens).toBeGreaterThan(0);
    }
  });

  it("completions, both ways", async () => {
    const out = await client.completions.create({ model: "sim-model", prompt: "Once upon a time", max_tokens: 4 });
    expect(out.choices[0]!.text).toBeTruthy();
    const stream = await client.completions.create({ model: "sim-model", prompt: "Once upon a time", max_tokens: 4, stream: true });
    let n = 0;
    for await (const chunk of stream) if (chunk.choices[0]?.text) n++;
    expect(n).toBe(4);
  });

  // Nodes without a models list serve whatever they load: the node itself says no, and its 404 reaches the client.
  it("models, and errors surface as APIError with the envelope", async () => {
    const models = await client.models.list();
    expect(models.data.map((m) => m.id)).toContain("sim-model");
    await expect(client.chat.completions.create({ model: "nope", messages: [{ role: "user", content: "x" }] })).rejects.toMatchObject({
      status: 404,
      message: expect.stringContaining("nope"),
    });
  });
});
