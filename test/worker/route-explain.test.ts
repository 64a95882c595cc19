import { SELF } from "cloudflare:test";
import { beforeEach, describe, expect, it } from "vitest";
import { chat, expectNoLoad, fault, post, putCluster, received, resetClusterState, resetSim, snapshot, P3, D3 } from "./helpers";

async function inBatches<T>(items: T[], size: number, fn: (item: T) => Promise<unknown>): Promise<void> {
  for (let i = 0; i < items.length; i += size) await Promise.all(items.slice(i, i + size).map(fn));
}

// POST /v1/route (SPEC 3, issue 3 item 6): the decision a body would get, explained, with nothing
// forwarded and no lease taken.

/** Fixed keys: a placement that fails fails every run (each file has its own workerd and engines). */
const RUN = "route-explain-run-1";
const ENGINES = ["p0", "p1", "p2", "d0", "d1", "d2", "c0", "c1"];

const affinity = { prefill: "affinity", decode: "affinity" };

/** A prompt nobody else sends, so the test can look for any trace of it in the answer. */
const SECRET = `confidential-${RUN}-the launch code is 0000 and the customer is Initech`;

async function explain(body: unknown, headers: Record<string, string> = {}): Promise<{ json: any; text: string }> {
  const res = await post("/v1/route", body, headers);
  const text = await res.text();
  expect(res.status, text).toBe(200);
  expect(res.headers.get("content-type")).toContain("application/json");
  return { json: JSON.parse(text), text };
}

async function placement(path: string, body: unknown, headers: Record<string, string> = {}) {
  const res = await post(path, body, headers);
  await res.text();
  return { status: res.status, p: res.headers.get("x-pd-prefill"), d: res.headers.get("x-pd-decode") };
}

async function expectNothingForwarded() {
  for (const id of ENGINES) expect(await received(id), id).toHaveLength(0);
}

/** What a dry run must leave as it was: leases, in-flight load, request counts and decision counters. */
const stateOf = async () => {
  const s = await snapshot();
  return {
    leases: s.leases,
    nodes: s.nodes.map((n) => ({ id: n.id, inflight: n.inflight, requestsTotal: n.requestsTotal })),
    decisions: s.decisions,
  };
};

describe("POST /v1/route answers the decision with its reasons", () => {
  beforeEach(async () => {
    await resetSim();
    await putCluster({ protocol: "vllm", policy: affinity, nodes: [...P3, ...D3] });
  });

  it("names P, D, the key, every candidate with load, health and rendezvous score, and the rule", async () => {
    const { json } = await explain(chat(`explain me ${RUN}`));
    expect(json.prefill).toMatchObject({ id: expect.stringMatching(/^p[012]$/), rule: "affinity" });
    expect(json.decode).toMatchObject({ id: expect.stringMatching(/^d[012]$/), rule: "affinity" });
    expect(json.rule).toEqual({ prefill: "affinity", decode: "affinity" });
    expect(json.key).toMatchObject({ source: "chat_prefix", hash: expect.stringMatching(/^[0-9a-f]{64}$/) });
    for (const [role, pool] of [
      ["prefill", P3],
      ["decode", D3],
    ] as const) {
      const candidates: any[] = json.candidates[role];
      expect(candidates.map((c) => c.id).sort()).toEqual(pool.map((n) => n.id));
      for (const c of candidates) {
        expect(c).toMatchObject({ id: expect.any(String), load: 0, healthy: true, rendezvous: expect.any(Number) });
        expect(Number.isFinite(c.rendezvous)).toBe(true);
      }
      // ranked best first; with nothing in flight the best-ranked node is the pick
      const scores = candidates.map((c) => c.rendezvous);
      expect(scores).toEqual([...scores].sort((a, b) => b - a));
      expect(candidates[0].id).toBe(json[role].id);
    }
    // P and D rank with different keys (decode adds a discriminator): the two orders are independent
    expect(json.candidates.prefill.map((c: any) => c.rendezvous)).not.toEqual(json.candidates.decode.map((c: any) => c.rendezvous));
  });

  it("the key is stable across turns and names its source: session, user, chat prefix, prompt prefix", async () => {
    const turn1 = {
      model: "sim-model",
      messages: [
        { role: "system", content: "Be brief." },
        { role: "user", content: `first ${RUN}` },
      ],
    };
    const turn2 = { ...turn1, messages: [...turn1.messages, { role: "assistant", content: "ok" }, { role: "user", content: "and then?" }] };
    const a = (await explain(turn1)).json;
    const b = (await explain(turn2)).json;
    expect(b.key).toEqual(a.key);
    expect([b.prefill.id, b.decode.id]).toEqual([a.prefill.id, a.decode.id]);
    // text parts canonicalise to the same key as a plain string
    const parts = { ...turn1, messages: [turn1.messages[0], { role: "user", content: [{ type: "text", text: `first ${RUN}` }] }] };
    expect((await explain(parts)).json.key.hash).toBe(a.key.hash);
    // a different first user message under the same system prompt is a different key
    expect((await explain({ ...turn1, messages: [turn1.messages[0], { role: "user", content: `other ${RUN}` }] })).json.key.hash).not.toBe(a.key.hash);

    expect((await explain(turn1, { "x-session-id": `s-${RUN}` })).json.key.source).toBe("session");
    expect((await explain({ ...turn1, user: `u-${RUN}` })).json.key.source).toBe("user");
    const completion = (await explain({ model: "sim-model", prompt: `Once upon a time ${RUN}`, max_tokens: 3 })).json;
    expect(completion.key.source).toBe("prompt_prefix");
    // only the first 512 characters decide
    const long = "x".repeat(512);
    expect((await explain({ model: "sim-model", prompt: `${long} tail one` })).json.key.hash).toBe(
      (await explain({ model: "sim-model", prompt: `${long} tail two` })).json.key.hash,
    );
  });

  it("never shows the raw prompt, user or session id: the key is a hash", async () => {
    const body = {
      model: "sim-model",
      user: `user-${SECRET}`,
      messages: [
        { role: "system", content: `system ${SECRET}` },
        { role: "user", content: `user ${SECRET}` },
      ],
    };
    for (const headers of [{}, { "x-session-id": `session-${SECRET}` }] as Record<string, string>[]) {
      const { text, json } = await explain(body, headers);
      expect(text).not.toContain(SECRET);
      expect(text).not.toContain("Initech");
      expect(text).not.toContain(RUN);
      expect(json.key.hash).toMatch(/^[0-9a-f]{64}$/);
    }
    const { text } = await explain({ model: "sim-model", prompt: `completion ${SECRET}` });
    expect(text).not.toContain(RUN);
  });

  it("forwards nothing and takes no lease", async () => {
    const before = await stateOf();
    await Promise.all(
      Array.from({ length: 6 }, (_, i) =>
        explain(i % 2 ? chat(`dry ${RUN} ${i}`, { stream: true }) : { model: "sim-model", prompt: `dry ${RUN} ${i}` }, i === 3 ? { "x-session-id": `dry-${RUN}` } : {}),
      ),
    );
    expect(await stateOf()).toEqual(before);
    await expectNothingForwarded();
  });

  it("its choice is what a real request with the same body then gets", async () => {
    const bodies: Array<[string, unknown, Record<string, string>]> = [
      ["/v1/chat/completions", chat(`same choice ${RUN} a`), {}],
      ["/v1/chat/completions", chat(`same choice ${RUN} b`, { stream: true }), {}],
      ["/v1/chat/completions", chat(`same choice ${RUN} c`, { user: `u-${RUN}` }), {}],
      ["/v1/chat/completions", chat(`same choice ${RUN} d`), { "x-session-id": `sid-${RUN}` }],
      ["/v1/completions", { model: "sim-model", prompt: `same choice ${RUN} e`, max_tokens: 3 }, {}],
    ];
    for (const [path, body, headers] of bodies) {
      const { json } = await explain(body, headers);
      expect(await placement(path, body, headers)).toEqual({ status: 200, p: json.prefill.id, d: json.decode.id });
      await expectNoLoad();
    }
  });

  it("bad bodies get the same 400 envelopes as the real routes", async () => {
    const chatBodies: unknown[] = [
      "{not json",
      "[1,2]",
      { model: 42, messages: [] },
      { model: "sim-model", messages: "hi" },
      { model: "sim-model", messages: [] },
      { model: "sim-model", messages: [{ content: "x" }] },
      chat("x", { stream: "yes" }),
      chat("x", { max_tokens: -1 }),
      { messages: [{ role: "user", content: "x" }] },
    ];
    const completionBodies: unknown[] = [
      { model: "sim-model", prompt: { text: "x" } },
      { model: "sim-model", prompt: [] },
      { model: "sim-model", prompt: "x", user: 7 },
    ];
    const cases = [...chatBodies.map((b) => ["/v1/chat/completions", b] as const), ...completionBodies.map((b) => ["/v1/completions", b] as const)];
    for (const [path, body] of cases) {
      const real = await post(path, body);
      const dry = await post("/v1/route", body);
      const label = `${path} ${typeof body === "string" ? body : JSON.stringify(body)}`;
      expect(real.status, label).toBeGreaterThanOrEqual(400);
      expect(real.status, label).toBeLessThan(500);
      expect(dry.status, label).toBe(real.status);
      const [r, d] = [(await real.json()) as any, (await dry.json()) as any];
      expect(Object.keys(d), label).toEqual(["error"]);
      expect(d, label).toEqual(r);
    }
    await expectNothingForwarded();
    await expectNoLoad();
  });

  it("a model no node serves is the same 404 on both", async () => {
    await putCluster({ protocol: "vllm", policy: affinity, nodes: [...P3, ...D3].map((n) => ({ ...n, models: ["sim-model"] })) });
    for (const [path, body] of [
      ["/v1/chat/completions", chat("x", { model: "no-such-model" })],
      ["/v1/completions", { model: "no-such-model", prompt: "x" }],
    ] as const) {
      const real = await post(path, body);
      const dry = await post("/v1/route", body);
      expect(real.status).toBe(404);
      expect(dry.status).toBe(404);
      const [r, d] = [(await real.json()) as any, (await dry.json()) as any];
      expect(r.error).toMatchObject({ code: "model_not_found", param: "model" });
      expect(d).toEqual(r);
    }
    await expectNothingForwarded();
  });

  // The body's kind is decided on its parsed top level (explainRoute, src/routes/explain.ts): a
  // completions body whose nested "messages" key is a JSON-schema property for structured output
  // is a completion, as /v1/completions serves it (a regex over the raw text once took it for chat).
  it('a completions body with a nested "messages" key is explained, not refused', async () => {
    const body = {
      model: "sim-model",
      prompt: `Summarise the thread as JSON ${RUN}`,
      max_tokens: 3,
      guided_json: { type: "object", properties: { messages: { type: "array", items: { type: "string" } } } },
    };
    const real = await placement("/v1/completions", body);
    expect(real.status).toBe(200);
    const dry = await post("/v1/route", body);
    expect(dry.status).toBe(200);
    const json: any = await dry.json();
    expect(json.key.source).toBe("prompt_prefix");
    expect([json.prefill.id, json.decode.id]).toEqual([real.p, real.d]);
  });
});

describe("POST /v1/route under the other policies", () => {
  beforeEach(async () => {
    await resetSim();
    await resetClusterState();
  });

  it("round_robin: a dry run does not advance the cursor; the real request gets the predicted pick", async () => {
    await putCluster({ protocol: "vllm", policy: { prefill: "round_robin", decode: "round_robin" }, nodes: [...P3, ...D3] });
    const body = chat(`rr ${RUN}`);
    const first = (await explain(body)).json;
    const second = (await explain(body)).json;
    expect(first.rule).toEqual({ prefill: "round_robin", decode: "round_robin" });
    expect(first.key.source).toBeNull();
    expect([second.prefill.id, second.decode.id]).toEqual([first.prefill.id, first.decode.id]);
    expect(await placement("/v1/chat/completions", body)).toEqual({ status: 200, p: first.prefill.id, d: first.decode.id });
    // the real request advanced both cursors by one
    const after = (await explain(body)).json;
    expect(after.prefill.id).not.toBe(first.prefill.id);
    expect(after.decode.id).not.toBe(first.decode.id);
    expect(await placement("/v1/chat/completions", body)).toEqual({ status: 200, p: after.prefill.id, d: after.decode.id });
  });

  it("cache_aware: after a real request with a long prompt, the candidates show its matched prefix blocks", async () => {
    await putCluster({
      protocol: "vllm",
      policy: { prefill: "cache_aware", decode: "cache_aware", cacheAware: { blockChars: 256 } },
      nodes: [...P3, ...D3],
    });
    const system = `Shared handbook ${RUN}. ` + "Every answer cites the handbook section it relies on. ".repeat(40);
    const turn1 = {
      model: "sim-model",
      max_tokens: 3,
      messages: [
        { role: "system", content: system },
        { role: "user", content: `question ${RUN}` },
      ],
    };
    // other traffic first, spread over the nodes: cache_aware also bounds each node's share of
    // recent requests, which on a cluster that routed one request alone would be that node's all
    await inBatches(
      Array.from({ length: 30 }, (_, i) => i),
      6,
      async (i) => expect((await placement("/v1/chat/completions", chat(`other traffic ${i}`))).status).toBe(200),
    );
    await expectNoLoad();
    const cold = (await explain(turn1)).json;
    expect(cold.key.prefixBlocks).toBeGreaterThanOrEqual(8);
    for (const role of ["prefill", "decode"] as const) {
      for (const c of cold.candidates[role]) expect(c).toMatchObject({ matchedBlocks: 0, score: expect.any(Number), load: 0, healthy: true });
    }

    const served = await placement("/v1/chat/completions", turn1);
    expect(served.status).toBe(200);
    await expectNoLoad();
    const warm = (await explain(turn1)).json;
    // the conversation's key now also has a sticky placement: the same nodes either way
    expect(["cache_aware", "sticky"]).toContain(warm.rule.prefill);
    expect(["cache_aware", "sticky"]).toContain(warm.rule.decode);
    const blocks = warm.key.prefixBlocks;
    for (const [role, chosen] of [
      ["prefill", served.p],
      ["decode", served.d],
    ] as const) {
      const candidates: any[] = warm.candidates[role];
      expect(candidates.find((c) => c.id === chosen).matchedBlocks, role).toBe(blocks);
      for (const c of candidates.filter((c) => c.id !== chosen)) expect(c.matchedBlocks, `${role} ${c.id}`).toBe(0);
      expect(candidates[0].id).toBe(chosen);
      expect(warm[role].id).toBe(chosen);
    }

    // the next turn shares those blocks and adds its own: a partial match on the same nodes
    const turn2 = { ...turn1, messages: [...turn1.messages, { role: "assistant", content: "x ".repeat(300) }, { role: "user", content: "more" }] };
    const next = (await explain(turn2)).json;
    expect(next.key.prefixBlocks).toBeGreaterThan(blocks);
    const held = next.candidates.prefill.find((c: any) => c.id === served.p);
    expect(held.matchedBlocks).toBeGreaterThan(0);
    expect(held.matchedBlocks).toBeLessThan(next.key.prefixBlocks);
    expect(next.prefill.id).toBe(served.p);
  });

  it("colocated: one node named for both legs, nothing forwarded", async () => {
    await putCluster({
      protocol: "colocated",
      policy: affinity,
      nodes: [
        { id: "c0", role: "both" },
        { id: "c1", role: "both" },
      ],
    });
    const { json } = await explain(chat(`colocated ${RUN}`));
    expect(json.prefill.id).toBe(json.decode.id);
    expect(json.rule.prefill).toBe("colocated");
    expect(json.candidates.decode.map((c: any) => c.id).sort()).toEqual(["c0", "c1"]);
    await expectNothingForwarded();
    expect(await placement("/v1/chat/completions", chat(`colocated ${RUN}`))).toEqual({ status: 200, p: json.decode.id, d: json.decode.id });
  });

  it("shows loads in flight and the bounded-load skip while a request holds the top D (loadSlack 0: the strict rule)", async () => {
    await putCluster({ protocol: "vllm", policy: { ...affinity, loadSlack: 0 }, nodes: [{ id: "p0", role: "prefill" }, ...D3] });
    const session = { "x-session-id": `held-${RUN}` };
    const idle = (await explain(chat("held"), session)).json;
    const top = idle.decode.id as string;
    // the top D holds the request until the test lets it go: no window to catch it in
    await fault(top, { mode: "hang" });
    const controller = new AbortController();
    SELF.fetch("http://router/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json", ...session },
      body: JSON.stringify(chat("held")),
      signal: controller.signal,
    }).catch(() => undefined);
    const deadline = Date.now() + 10_000;
    let busy: any;
    do {
      busy = (await explain(chat("held"), session)).json;
    } while (busy.candidates.decode.find((c: any) => c.id === top).load === 0 && Date.now() < deadline);
    // the held request is on the top D (the only one in flight), which is now over its bound
    expect(busy.candidates.decode.map((c: any) => [c.id, c.load])).toEqual(busy.candidates.decode.map((c: any) => [c.id, c.id === top ? 1 : 0]));
    expect(busy.candidates.decode.find((c: any) => c.id === top)).toMatchObject({ load: 1, skipped: "over_bound" });
    expect(busy.rule.decode).toBe("affinity_bounded_skip");
    expect(busy.decode.id).not.toBe(top);
    controller.abort();
    await expectNoLoad();
  });
});
