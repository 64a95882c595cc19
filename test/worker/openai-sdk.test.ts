import { SELF } from "cloudflare:test";
import OpenAI from "openai";
import { beforeAll, describe, expect, it } from "vitest";
import { putCluster, resetSim } from "./helpers";

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

  it("chat, streaming with usage", async () => {
    const stream = await client.chat.completions.create({
      model: "sim-model",
      messages: [{ role: "user", content: "Count" }],
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
    expect(text.length).toBeGreaterThan(0);
    expect(usage?.completion_tokens).toBe(6);
    expect(usage?.prompt_tokens_details?.cached_tokens).toBeTypeOf("number");
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
