// Issue 10 item 6 against the strict simulator: vLLM hands out one KV handle per response, so a
// batched /v1/completions (a list of prompts) is split into one P/D pair per prompt and merged;
// P always gets n: 1.
import { beforeEach, describe, expect, it } from "vitest";
import { expectNoLoad, post, putCluster, received, resetClusterState, resetSim } from "./helpers";
import { expectedPrefix, sseEvents, stats, waitFor } from "./engines-helpers";

const completion = (prompt: unknown, extra: Record<string, unknown> = {}) => ({ model: "sim-model", prompt, max_tokens: 4, ...extra });
const prompts = ["The first prompt of the batch", "A second, different prompt", "Third: yet another prompt"];

describe("batched /v1/completions: one P/D pair per prompt, one merged answer", () => {
  beforeEach(async () => {
    await resetSim();
    await resetClusterState();
    await putCluster({
      protocol: "vllm",
      policy: { prefill: "round_robin", decode: "round_robin" },
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
        { id: "d1", role: "decode" },
      ],
    });
  });

  async function checkEngines(expectedPrefills: number) {
    const pBodies = (await received("p0")).map((r) => JSON.parse(r.body));
    expect(pBodies.length).toBe(expectedPrefills);
    // each P request carries one prompt and never asks P for several samples
    for (const b of pBodies) {
      expect(Array.isArray(b.prompt) && b.prompt.length > 1 && typeof b.prompt[0] === "string").toBe(false);
      expect(b.n ?? 1).toBe(1);
    }
    for (const id of ["d0", "d1"]) {
      const s = await stats(id);
      expect(s.staleHandleReads).toBe(0);
      expect(s.foreignHandleReads).toBe(0);
    }
    // every handle P issued was read: none left held for the timeout
    const p = await waitFor(
      () => stats("p0"),
      (s) => s.heldHandles === 0,
      2000,
      "p0 holds no handle",
    );
    expect(p.issuedHandles).toBe(p.consumedHandles + p.releasedHandles);
  }

  it("non-streamed: choices indexed per prompt in order, each choice's text its own prompt's, usage summed", async () => {
    const body = completion(prompts);
    const res = await post("/v1/completions", body);
    expect(res.status).toBe(200);
    const json: any = await res.json();
    expect(json.choices.map((c: any) => c.index)).toEqual([0, 1, 2]);
    for (const c of json.choices) expect(c.text.startsWith(expectedPrefix(body, c.index))).toBe(true);
    const promptTokens = prompts.reduce((n, q) => n + Math.ceil(q.length / 4), 0);
    expect(json.usage.prompt_tokens).toBe(promptTokens);
    expect(json.usage.completion_tokens).toBe(12);
    expect(json.usage.total_tokens).toBe(promptTokens + 12);
    await checkEngines(3);
    await expectNoLoad();
  });

  it("streamed: one merged SSE stream with each prompt's index and one [DONE]", async () => {
    const body = completion(prompts, { stream: true, stream_options: { include_usage: true } });
    const res = await post("/v1/completions", body);
    expect(res.status).toBe(200);
    const events = sseEvents(await res.text());
    expect(events.filter((e) => e === "[DONE]").length).toBe(1);
    expect(events.at(-1)).toBe("[DONE]");
    expect(events.some((e) => e !== "[DONE]" && e.error)).toBe(false);
    for (let i = 0; i < prompts.length; i++) {
      const text = events
        .filter((e) => e !== "[DONE]")
        .flatMap((e) => e.choices ?? [])
        .filter((c: any) => c.index === i)
        .map((c: any) => c.text)
        .join("");
      expect(text.startsWith(expectedPrefix(body, i))).toBe(true);
    }
    const indexes = new Set(events.filter((e) => e !== "[DONE]").flatMap((e) => (e.choices ?? []).map((c: any) => c.index)));
    expect([...indexes].sort()).toEqual([0, 1, 2]);
    const usage = events.filter((e) => e !== "[DONE]" && e.usage);
    expect(usage.length).toBe(1);
    expect(usage[0].usage.completion_tokens).toBe(12);
    await checkEngines(3);
    await expectNoLoad();
  });

  it("n > 1: P gets n: 1, the client gets n choices of its prompt", async () => {
    const body = completion("One prompt, several samples", { n: 2 });
    const res = await post("/v1/completions", body);
    expect(res.status).toBe(200);
    const json: any = await res.json();
    expect(json.choices.map((c: any) => c.index).sort()).toEqual([0, 1]);
    for (const c of json.choices) expect(c.text.startsWith(expectedPrefix(body))).toBe(true);
    // one prompt: one prefill, whatever n (D samples n times from the one KV)
    await checkEngines(1);
    await expectNoLoad();
  });

  it("a batch with n > 1: prompt i, sample j is choice i*n + j", async () => {
    const body = completion(prompts.slice(0, 2), { n: 2 });
    const res = await post("/v1/completions", body);
    expect(res.status).toBe(200);
    const json: any = await res.json();
    expect(json.choices.map((c: any) => c.index).sort()).toEqual([0, 1, 2, 3]);
    for (const c of json.choices) expect(c.text.startsWith(expectedPrefix(body, Math.floor(c.index / 2)))).toBe(true);
    // one prefill a prompt, not one a sample
    await checkEngines(2);
    await expectNoLoad();
  });
});
