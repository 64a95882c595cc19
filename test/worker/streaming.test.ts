import { SELF } from "cloudflare:test";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { enginesIdle } from "./engines-helpers";
import { chat, control, engineSawAbort, expectNoLoad, fault, post, putCluster, resetSim, snapshot } from "./helpers";

const slowCluster = {
  protocol: "vllm",
  policy: { prefill: "round_robin", decode: "round_robin" },
  nodes: [
    { id: "p0", role: "prefill" as const },
    { id: "slow", role: "decode" as const },
  ],
};

async function readAll(res: Response): Promise<{ text: string; reads: number[] }> {
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  let text = "";
  const reads: number[] = [];
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return { text, reads };
    reads.push(Date.now());
    text += decoder.decode(value, { stream: true });
  }
}

describe("streaming: D's body reaches the client as it is produced", () => {
  beforeEach(async () => {
    await resetSim();
    await putCluster(slowCluster);
  });
  // every engine has closed every request: a test leaves nothing running into the next one
  afterEach(() => enginesIdle());

  it("delivers tokens incrementally, not in one buffered piece", async () => {
    const TOKENS = 200;
    // 200 tokens at 15 ms each (3 s): the client reads its first token while D is still generating,
    // with seconds to spare for a busy machine to deliver it and read D's stats (64 tokens, ~1 s, did not)
    const res = await post("/v1/chat/completions", chat("stream please", { stream: true, max_tokens: TOKENS }));
    expect(res.status).toBe(200);
    const reader = res.body!.getReader();
    const decoder = new TextDecoder();
    let text = "";
    while (!text.includes('"content"')) {
      const { done, value } = await reader.read();
      expect(done).toBe(false);
      text += decoder.decode(value, { stream: true });
    }
    const during = await control("/engines/slow/stats");
    // D's answer is still open and not all its tokens are out: the client was not waiting for the whole
    expect(during.inflight).toBe(1);
    expect(during.outputTokens).toBeLessThan(TOKENS);
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      text += decoder.decode(value, { stream: true });
    }
    expect(text.trimEnd().endsWith("data: [DONE]")).toBe(true);
    expect((await control("/engines/slow/stats")).outputTokens).toBe(TOKENS);
    await expectNoLoad();
  });

  it("a client disconnect aborts the decode leg and releases the load", async () => {
    const controller = new AbortController();
    const res = await SELF.fetch("http://router/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(chat("long answer", { stream: true, max_tokens: 400 })),
      signal: controller.signal,
    });
    const reader = res.body!.getReader();
    await reader.read();
    controller.abort();
    await reader.cancel().catch(() => undefined);
    await expectNoLoad();
    // The engine saw its client (the router) go away long before 400 tokens (~6 s).
    await engineSawAbort("slow");
    await enginesIdle();
  });

  it("a client disconnect after P answered but before D's first byte aborts D and releases the load", async () => {
    // (count 1: only the decode attempt is slow, not the handle release that follows it)
    await fault("slow", { mode: "slow", delayMs: 1500, count: 1 });
    const controller = new AbortController();
    const pending = SELF.fetch("http://router/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(chat("waiting for D", { stream: true })),
      signal: controller.signal,
    });
    // wait until P has answered and the decode leg is out
    const deadline = Date.now() + 3000;
    while (Date.now() < deadline && ((await control("/engines/slow/stats")).inflight ?? 0) < 1) await new Promise((r) => setTimeout(r, 20));
    expect((await control("/engines/p0/stats")).inflight).toBe(0);
    controller.abort();
    await expect(pending).rejects.toThrow();
    await expectNoLoad();
    await engineSawAbort("slow");
  });

  it("a decode node dying mid-stream ends the stream with an error event, never [DONE]", async () => {
    await fault("slow", { mode: "midstream", afterChunks: 2 });
    const res = await post("/v1/chat/completions", chat("will break", { stream: true, max_tokens: 20 }));
    expect(res.status).toBe(200);
    const { text } = await readAll(res);
    expect(text).toContain("event: error");
    expect(text).not.toContain("[DONE]");
    const errorLine = text
      .split("\n")
      .filter((l) => l.startsWith("data:"))
      .at(-1)!;
    expect(JSON.parse(errorLine.slice(5)).error.type).toBe("upstream_error");
    await expectNoLoad();
  });
});

describe("a stream that ends cleanly but incomplete (a proxy or engine that cut it)", () => {
  beforeEach(resetSim);

  it("ends with an error event, not as a complete answer, and counts against D", async () => {
    await putCluster({ protocol: "colocated", policy: { prefill: "round_robin", decode: "round_robin" }, nodes: [{ id: "c0", role: "both" }] });
    const event = { id: "x", object: "chat.completion.chunk", choices: [{ index: 0, delta: { content: "half" } }] };
    await fault("c0", { mode: "respond", status: 200, headers: { "content-type": "text/event-stream" }, body: `data: ${JSON.stringify(event)}\n\n`, count: 1 });
    const failuresBefore = (await snapshot()).nodes.find((n) => n.id === "c0")?.failuresTotal ?? 0;
    const res = await post("/v1/chat/completions", chat("cut", { stream: true }));
    expect(res.status).toBe(200);
    const { text } = await readAll(res);
    expect(text).toContain('"half"');
    expect(text).toContain("event: error");
    expect(text).toContain("upstream_stream_incomplete");
    expect(text).not.toContain("[DONE]");
    // the failure is reported with the request's finish, in the background: once the lease is
    // released it has been counted
    const after = await expectNoLoad();
    expect(after.nodes.find((n) => n.id === "c0")!.failuresTotal - failuresBefore).toBe(1);
  });
});

describe("upstream failures before streaming are proper error responses", () => {
  beforeEach(async () => {
    await resetSim();
  });

  it("a 500 from the only decode node gives a 502 envelope and no stream", async () => {
    await putCluster({
      protocol: "vllm",
      policy: { prefill: "round_robin", decode: "round_robin" },
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
      ],
    });
    await fault("d0", { mode: "status500" });
    const res = await post("/v1/chat/completions", chat("x", { stream: true }));
    expect(res.status).toBe(502);
    const body: any = await res.json();
    expect(body.error.type).toBe("upstream_error");
    expect(body.error.message).toContain("d0");
    expect(res.headers.get("x-request-id")).toBeTruthy();
    await expectNoLoad();
  });

  it("a node's 400 is passed on as the client's error", async () => {
    await putCluster({
      protocol: "vllm",
      policy: { prefill: "round_robin", decode: "round_robin" },
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
      ],
    });
    await fault("p0", { mode: "status400" });
    const res = await post("/v1/chat/completions", chat("x"));
    expect(res.status).toBe(400);
    expect(((await res.json()) as any).error.code).toBe("upstream_rejected");
    await expectNoLoad();
  });

  it("a prefill node that never answers times out with 504", async () => {
    await putCluster({
      protocol: "vllm",
      policy: { prefill: "round_robin", decode: "round_robin" },
      timeouts: { prefillMs: 300, decodeFirstByteMs: 300 },
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
      ],
    });
    await fault("p0", { mode: "hang" });
    const res = await post("/v1/chat/completions", chat("x"));
    expect(res.status).toBe(504);
    expect(((await res.json()) as any).error.code).toBe("upstream_timeout");
    await expectNoLoad();
  });
});
