// Conditional disaggregation, cache-hit feedback and route receipts through the Worker, against
// the strict simulator (SPEC 8; issue 17 part 2): what the client sees (x-pd-mode, x-pd-prefill),
// what the engines received (a D prefilling alone gets no kv_transfer_params; P gets nothing),
// what /v1/route and /metrics say.
import { runDurableObjectAlarm, SELF } from "cloudflare:test";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { control, fault, post, putCluster, received, resetSim, type NodeSpec } from "./helpers";
import { waitFor as pollUntil } from "./engines-helpers";
import { resetState, stub } from "./signals-helpers";
import { LOST_AFTER_MISSES } from "../../src/state/cache-feedback";
import { seededRandom } from "../support/seeded";

const P = (id: string, extra: Partial<NodeSpec> & { localPrefill?: boolean } = {}): NodeSpec => ({ id, role: "prefill", ...extra });
const D = (id: string, extra: Partial<NodeSpec> & { localPrefill?: boolean } = {}): NodeSpec => ({ id, role: "decode", ...extra });
const RUN = seededRandom(13)().toString(36).slice(2, 8);

/** A conversation whose system prompt is `blocks` prefix blocks long (2,048 characters each, ~512 tokens). */
function conversation(name: string, blocks = 6) {
  const system = `${name} ${RUN} handbook. `.padEnd(blocks * 2048, `${name} rule. `);
  const messages: Array<{ role: string; content: string }> = [{ role: "system", content: system }];
  return {
    /** the next turn's body: the history plus a new short question */
    turn(i: number, extra: Record<string, unknown> = {}) {
      if (i > 1) messages.push({ role: "assistant", content: `answer ${i - 1}` });
      messages.push({ role: "user", content: `${name} question ${i}` });
      return { model: "sim-model", max_tokens: 3, messages: [...messages], ...extra };
    },
  };
}

async function send(path: string, body: unknown, headers: Record<string, string> = {}) {
  const res = await post(path, body, headers);
  const text = await res.text();
  expect(res.status, text).toBe(200);
  return { res, text, mode: res.headers.get("x-pd-mode"), p: res.headers.get("x-pd-prefill"), d: res.headers.get("x-pd-decode") };
}

async function explain(body: unknown): Promise<any> {
  const res = await post("/v1/route", body);
  expect(res.status).toBe(200);
  return res.json();
}

/** Completion requests an engine got (the release requests apart), with their parsed bodies. */
async function completions(id: string) {
  return (await received(id)).filter((r) => r.path.startsWith("/v1/")).map((r) => JSON.parse(r.body) as Record<string, unknown>);
}

async function nodeFeedback(id: string) {
  const snap = await stub().snapshot();
  return snap.nodes.find((n) => n.id === id)!.prefix;
}

/** The shared poller (engines-helpers), with this file's 5 s deadline and its (read, ok, what) order. */
const waitFor = <T>(read: () => Promise<T>, ok: (v: T) => boolean, what: string): Promise<T> => pollUntil(read, ok, 5000, what);

const conditional = (nodes: NodeSpec[], policy: Record<string, unknown> = {}, extra: Record<string, unknown> = {}) =>
  putCluster({ protocol: "vllm", policy: { prefill: "affinity", decode: "affinity", disaggregation: "conditional", ...policy }, nodes, ...extra });

beforeEach(async () => {
  await resetSim();
  await resetState();
});

describe("conditional disaggregation: a warm turn is prefilled by D alone", () => {
  it("turn 1 (cold, long) goes P then D; turn 2 (warm on D) goes to D alone with no kv_transfer_params and P gets nothing", async () => {
    await conditional([P("p0"), D("d0"), D("d1")]);
    const chat = conversation("warm");
    const first = chat.turn(1);
    const route1 = await explain(first);
    expect(route1).toMatchObject({ mode: "disaggregated", reason: "cold" });
    expect(route1.uncachedTokens).toBeGreaterThan(2048);
    const one = await send("/v1/chat/completions", first);
    expect(one).toMatchObject({ mode: "disaggregated", p: "p0" });
    const d = one.d!;
    expect((await completions(d)).at(-1)?.kv_transfer_params).toMatchObject({ do_remote_prefill: true });

    const second = chat.turn(2);
    const route2 = await explain(second);
    expect(route2).toMatchObject({ mode: "local", reason: "cached", decode: { id: d }, prefill: { id: d, rule: "local_prefill" } });
    expect(route2.uncachedTokens).toBeLessThan(2048);
    // per decode candidate: the prompt's tokens that node lacks
    const byId = Object.fromEntries(route2.candidates.decode.map((c: any) => [c.id, c]));
    expect(byId[d].uncachedTokens).toBe(route2.uncachedTokens);
    expect(byId[d === "d0" ? "d1" : "d0"].uncachedTokens).toBe(route2.promptTokens);

    const prefillsBefore = (await completions("p0")).length;
    const two = await send("/v1/chat/completions", second);
    expect(two).toMatchObject({ mode: "local", p: d, d });
    const toD = (await completions(d)).at(-1)!;
    expect(toD).not.toHaveProperty("kv_transfer_params");
    expect(toD.messages).toEqual(second.messages);
    expect((await completions("p0")).length).toBe(prefillsBefore);
    // the client's usage is D's own: it had most of the prompt cached
    const usage = JSON.parse(two.text).usage;
    expect(usage.prompt_tokens_details.cached_tokens).toBeGreaterThan(usage.prompt_tokens / 2);
  });

  it("a conversation longer than the blocks one request records (maxBlocksPerRequest) is still warm on its next turn: the index keeps its end", async () => {
    // 12 blocks of system prompt (~6,000 tokens), 4 recorded a request: without the end entry turn 2
    // would look 8 blocks (~4,000 tokens) cold on D, over the 2,048-token threshold, and go P then D
    await conditional([P("p0"), D("d0"), D("d1")], { cacheAware: { maxBlocksPerRequest: 4 } });
    const chat = conversation("beyond-cap", 12);
    const one = await send("/v1/chat/completions", chat.turn(1));
    expect(one.mode).toBe("disaggregated");
    const second = chat.turn(2);
    const route2 = await explain(second);
    expect(route2).toMatchObject({ mode: "local", reason: "cached", decode: { id: one.d } });
    expect(route2.uncachedTokens).toBeLessThan(512);
    expect((await send("/v1/chat/completions", second)).mode).toBe("local");
  });

  it.each(["round_robin", "affinity", "cache_aware", "least_load"])(
    "works under decode policy %s (the decode index records what D received whatever the policy)",
    async (policy) => {
      await conditional([P("p0"), D("d0")], { prefill: policy, decode: policy });
      const chat = conversation(`policy-${policy}`);
      expect((await send("/v1/chat/completions", chat.turn(1))).mode).toBe("disaggregated");
      expect((await send("/v1/chat/completions", chat.turn(2))).mode).toBe("local");
    },
  );

  it("a stream prefilled by D alone carries x-pd-mode local and its usage frame untouched", async () => {
    await conditional([P("p0"), D("d0")]);
    const chat = conversation("stream");
    await send("/v1/chat/completions", chat.turn(1));
    const two = await send("/v1/chat/completions", chat.turn(2, { stream: true, stream_options: { include_usage: true } }));
    expect(two.mode).toBe("local");
    expect(two.res.headers.get("content-type")).toContain("text/event-stream");
    expect(two.text).toContain('"cached_tokens"');
    expect(two.text.trimEnd().endsWith("data: [DONE]")).toBe(true);
    // its answer taught the object: predicted and reported cached tokens were counted for d0
    const fb = await waitFor(
      () => nodeFeedback("d0"),
      (f) => f.cachedTokens > 0,
      "d0 feedback",
    );
    expect(fb.predictedTokens).toBeGreaterThan(0);
  });

  it("under vllm-mooncake too: a warm turn goes to D alone (no transfer), and P's usage (read beside D's stream) teaches the prefill index", async () => {
    const { bootstrapPort } = await control("/engines/pslow/options");
    await putCluster({
      protocol: "vllm-mooncake",
      policy: { prefill: "cache_aware", decode: "cache_aware", disaggregation: "conditional" },
      nodes: [{ id: "pslow", role: "prefill", bootstrapPort } as NodeSpec, D("d0")],
    });
    const chat = conversation("mooncake");
    const one = await send("/v1/chat/completions", chat.turn(1));
    expect(one).toMatchObject({ mode: "disaggregated", p: "pslow", d: "d0" });
    expect((await completions("d0")).at(-1)?.kv_transfer_params).toMatchObject({ do_remote_prefill: true });
    const two = await send("/v1/chat/completions", chat.turn(2));
    expect(two).toMatchObject({ mode: "local", p: "d0", d: "d0" });
    expect((await completions("d0")).at(-1)).not.toHaveProperty("kv_transfer_params");
    expect((await completions("pslow")).length).toBe(1);
    // disaggregating again (always), P's answer — read beside D's stream — reports what P had cached
    await putCluster({
      protocol: "vllm-mooncake",
      policy: { prefill: "cache_aware", decode: "cache_aware" },
      nodes: [{ id: "pslow", role: "prefill", bootstrapPort } as NodeSpec, D("d0")],
    });
    expect((await send("/v1/chat/completions", chat.turn(3))).mode).toBe("disaggregated");
    const fb = await waitFor(
      () => nodeFeedback("pslow"),
      (f) => f.predictedTokens > 0 && f.cachedTokens > 0,
      "pslow feedback",
    );
    expect(Math.abs(fb.predictedTokens - fb.cachedTokens)).toBeLessThan(600);
  });

  it("a localPrefill: false node never prefills alone: every turn goes P then D (reason no_local_prefill)", async () => {
    await conditional([P("p0"), D("d0", { localPrefill: false })]);
    const chat = conversation("nolocal");
    for (let i = 1; i <= 4; i++) {
      const body = chat.turn(i);
      if (i > 1) expect(await explain(body)).toMatchObject({ mode: "disaggregated", reason: "no_local_prefill" });
      expect((await send("/v1/chat/completions", body)).mode).toBe("disaggregated");
    }
    expect((await completions("d0")).every((b) => (b.kv_transfer_params as any)?.do_remote_prefill === true)).toBe(true);
  });

  it("under sglang never local: D always gets the bootstrap room, P always runs", async () => {
    await putCluster({ protocol: "sglang", policy: { prefill: "affinity", decode: "affinity", disaggregation: "conditional" }, nodes: [P("p0"), D("d0")] });
    const chat = conversation("sglang");
    for (let i = 1; i <= 3; i++) {
      const body = chat.turn(i);
      const route = await explain(body);
      expect(route.mode).toBe("disaggregated");
      if (i > 1) expect(route.reason).toBe("no_local_prefill");
      expect((await send("/v1/chat/completions", body)).mode).toBe("disaggregated");
    }
    const toD = await completions("d0");
    expect(toD.length).toBe(3);
    expect(toD.every((b) => b.bootstrap_room !== undefined)).toBe(true);
    expect((await completions("p0")).length).toBe(3);
  });

  it("`always` keeps disaggregating every turn (reason always)", async () => {
    await putCluster({ protocol: "vllm", policy: { prefill: "affinity", decode: "affinity" }, nodes: [P("p0"), D("d0")] });
    const chat = conversation("always");
    for (let i = 1; i <= 3; i++) {
      const body = chat.turn(i);
      expect(await explain(body)).toMatchObject({ mode: "disaggregated", reason: "always" });
      expect((await send("/v1/chat/completions", body)).mode).toBe("disaggregated");
    }
    expect((await completions("p0")).length).toBe(3);
  });
});

describe("cache-hit feedback: an engine restart clears what the router believed it held", () => {
  it(`${LOST_AFTER_MISSES} answers in a row that found nothing of well-predicted prefixes drop d0's entries: the next conversation is routed cold, then re-learns`, async () => {
    await conditional([P("p0"), D("d0")]);
    // LOST_AFTER_MISSES conversations re-sent after the restart, and one more that is not
    const chats = Array.from({ length: LOST_AFTER_MISSES + 1 }, (_, i) => conversation(`restart-${i}`));
    for (const chat of chats) {
      expect((await send("/v1/chat/completions", chat.turn(1))).mode).toBe("disaggregated");
      expect((await send("/v1/chat/completions", chat.turn(2))).mode).toBe("local");
    }
    const warm = await waitFor(
      () => nodeFeedback("d0"),
      (f) => f.cachedTokens > 0 && f.predictedTokens > 0,
      "warm feedback",
    );
    expect(warm.cacheLost).toBe(0);

    // the engine restarts: its prefix cache is empty; the router still predicts them all warm
    await control("/engines/d0/reset", {});
    for (const chat of chats.slice(0, LOST_AFTER_MISSES)) {
      expect((await send("/v1/chat/completions", chat.turn(3))).mode).toBe("local");
    }
    const lost = await waitFor(
      () => nodeFeedback("d0"),
      (f) => f.cacheLost === 1,
      "cache lost",
    );
    expect(lost.predictedTokens).toBeGreaterThan(lost.cachedTokens);

    // the last conversation was never re-sent: its entries went with the rest, so it is cold again
    const last = chats[LOST_AFTER_MISSES]!;
    expect(await explain(last.turn(3))).toMatchObject({ mode: "disaggregated", reason: "cold" });
    expect((await send("/v1/chat/completions", last.turn(3))).mode).toBe("disaggregated");
    // and re-learns: its next turn is local once more
    expect((await send("/v1/chat/completions", last.turn(4))).mode).toBe("local");
  });

  it("a node whose probes fail and come back (a restart) is forgotten: its warm conversations are routed cold", async () => {
    await conditional([P("p0"), D("d0")], {}, { health: { intervalMs: 600_000, downAfter: 2, upAfter: 2 } });
    const chat = conversation("probes");
    await send("/v1/chat/completions", chat.turn(1));
    await send("/v1/chat/completions", chat.turn(2));
    const next = chat.turn(3);
    expect((await explain(next)).mode).toBe("local");
    const alarm = () => runDurableObjectAlarm(stub() as never);
    await fault("d0", { health: false });
    await alarm();
    await alarm();
    expect((await stub().snapshot()).nodes.find((n) => n.id === "d0")?.probeUp).toBe(false);
    await fault("d0", { health: true });
    await alarm();
    await alarm();
    expect((await stub().snapshot()).nodes.find((n) => n.id === "d0")?.probeUp).toBe(true);
    expect(await explain(next)).toMatchObject({ mode: "disaggregated", reason: "cold" });
  });

  it("P's answers under vllm teach the prefill index too: predicted vs reported cached tokens per P", async () => {
    await putCluster({ protocol: "vllm", policy: { prefill: "cache_aware", decode: "cache_aware" }, nodes: [P("p0"), D("d0")] });
    const chat = conversation("prefill-feedback");
    for (let i = 1; i <= 3; i++) await send("/v1/chat/completions", chat.turn(i));
    const fb = await waitFor(
      () => nodeFeedback("p0"),
      (f) => f.predictedTokens > 0 && f.cachedTokens > 0,
      "p0 feedback",
    );
    // the router's guess and the engine's count agree to within a block a turn (2 warm turns)
    expect(Math.abs(fb.predictedTokens - fb.cachedTokens)).toBeLessThan(2 * 600);
    // and the engine's tokens taught the rate: the simulator reads 4 characters a token
    expect(fb.charsPerToken).toBeGreaterThan(3.5);
    expect(fb.charsPerToken).toBeLessThan(4.5);
  });
});

describe("route receipts: x-pd-mode on every routed response, the reason in the log line", () => {
  const logs: Array<Record<string, unknown>> = [];
  beforeEach(() => {
    logs.length = 0;
    vi.spyOn(console, "log").mockImplementation((line: unknown) => {
      try {
        logs.push(JSON.parse(String(line)));
      } catch {
        // not a log line of ours
      }
    });
  });
  afterEach(() => vi.restoreAllMocks());
  const requestLog = async (id: string) =>
    waitFor(
      async () => logs.find((l) => l.event === "request" && l.requestId === id),
      (l) => l !== undefined,
      `log line of ${id}`,
    );

  it("chat, completions, responses, a batch and a one-hop route each say how they were served", async () => {
    await conditional([P("p0"), D("d0")], { prefill: "round_robin", decode: "round_robin" });
    const chat = await send("/v1/chat/completions", { model: "sim-model", max_tokens: 2, messages: [{ role: "user", content: "receipt chat" }] }, { "x-request-id": "rc-chat" });
    // a short cold prompt: 100% uncached is not below localPrefillRatio, so P/D
    expect(chat.mode).toBe("disaggregated");
    expect(await requestLog("rc-chat")).toMatchObject({ mode: "disaggregated", reason: "cold" });

    const completion = await send("/v1/completions", { model: "sim-model", max_tokens: 2, prompt: "receipt completion" });
    expect(completion.mode).toBe("disaggregated");

    const responses = await send("/v1/responses", { model: "sim-model", max_output_tokens: 2, input: "receipt responses" });
    expect(responses.mode).toBe("disaggregated");
    const id = JSON.parse(responses.text).id as string;
    // a turn continuing a stored response is served by its D alone
    const pinned = await send("/v1/responses", { model: "sim-model", max_output_tokens: 2, input: "and then?", previous_response_id: id }, { "x-request-id": "rc-pinned" });
    expect(pinned).toMatchObject({ mode: "local", p: "d0", d: "d0" });
    expect(await requestLog("rc-pinned")).toMatchObject({ mode: "local", reason: "pinned" });

    const batch = await send("/v1/completions", { model: "sim-model", max_tokens: 2, prompt: ["receipt batch one", "receipt batch two"] });
    expect(batch.mode).toBe("disaggregated,disaggregated");

    const embeddings = await send("/v1/embeddings", { model: "sim-model", input: "receipt embeddings" }, { "x-request-id": "rc-emb" });
    expect(embeddings).toMatchObject({ mode: "colocated", p: "d0", d: "d0" });
    expect(await requestLog("rc-emb")).toMatchObject({ mode: "colocated", reason: "always" });
  });

  it("protocol colocated: colocated, reason always", async () => {
    await putCluster({ protocol: "colocated", policy: { prefill: "round_robin", decode: "round_robin" }, nodes: [{ id: "c0", role: "both" }] });
    const body = { model: "sim-model", max_tokens: 2, messages: [{ role: "user", content: "receipt colocated" }] };
    expect(await explain(body)).toMatchObject({ mode: "colocated", reason: "always" });
    expect((await send("/v1/chat/completions", body)).mode).toBe("colocated");
  });
});

describe("/metrics", () => {
  it("has every (mode, reason) and the per-node predicted and reported cached tokens from the start, and counts decisions", async () => {
    await conditional([P("p0"), D("d0")]);
    const read = async () => (await SELF.fetch("http://router/metrics")).text();
    const before = await read();
    for (const [mode, reason] of [
      ["disaggregated", "always"],
      ["disaggregated", "cold"],
      ["disaggregated", "decode_busy"],
      ["disaggregated", "no_local_prefill"],
      ["local", "cached"],
      ["local", "prefill_busy"],
      ["local", "pinned"],
      ["colocated", "always"],
    ]) {
      expect(before).toMatch(new RegExp(`^pd_router_disagg_decisions_total\\{mode="${mode}",reason="${reason}"\\} \\d+$`, "m"));
    }
    for (const node of ["p0", "d0"]) {
      expect(before).toMatch(new RegExp(`^pd_router_prefix_predicted_tokens_total\\{node="${node}"\\} \\d+$`, "m"));
      expect(before).toMatch(new RegExp(`^pd_router_prefix_cached_tokens_total\\{node="${node}"\\} \\d+$`, "m"));
    }
    const count = (text: string, mode: string, reason: string) =>
      Number(new RegExp(`^pd_router_disagg_decisions_total\\{mode="${mode}",reason="${reason}"\\} (\\d+)$`, "m").exec(text)?.[1]);
    const chat = conversation("metrics");
    await send("/v1/chat/completions", chat.turn(1));
    await send("/v1/chat/completions", chat.turn(2));
    const after = await waitFor(read, (t) => count(t, "local", "cached") === count(before, "local", "cached") + 1, "local decision counted");
    expect(count(after, "disaggregated", "cold")).toBe(count(before, "disaggregated", "cold") + 1);
  });
});
