import { runInDurableObject } from "cloudflare:test";
import { beforeEach, describe, expect, it } from "vitest";
import {
  chatBody,
  completionsTo,
  engineFault,
  explain,
  kv,
  poll,
  post,
  putNodes,
  resetEngines,
  resetState,
  sendChat,
  setMetrics,
  signalsRig,
  snapshot,
  stub,
  useSignalsRig,
  waitFor,
} from "./signals-helpers";
import { conversations } from "../support/conversation";
import { ATTENTION_CONTEXT_TOKENS } from "../../src/routing/predict";

useSignalsRig();

// Predicted disaggregation through the Worker (SPEC 9, issue 23 item 2): what the engines' own
// figures (steered /metrics) and the learned rates make of a request — which D, local or not —
// and how a node made slower is learned.

/** A conversation of 6 prefix blocks (~3,100 tokens), apart from other runs' */
// a fixed suffix: every file starts from fresh engines and a clean router (docs/testing.md), and a
// random one would move the conversations' hashes, and with them the nodes they meet, run to run
const conversation = conversations("dpred");
// the engine queue is the prediction's to weigh, not the guard's: queueBusy out of the way
const signals = { intervalMs: 600_000, staleMs: 1_200_000, queueBusy: 1000 };
const predicted = (decode = "affinity") => ({ policy: { prefill: "affinity", decode, disaggregation: "predicted" }, signals });

const byId = (list: any[]) => Object.fromEntries(list.map((c) => [c.id, c]));

beforeEach(async () => {
  // each test starts from the profile's rates: resetState forgets what an earlier one taught the object
  await resetState();
  await resetEngines();
  for (const id of ["p0", "d0", "d1", "c0"]) await setMetrics(id, kv(0.1, { capacityTokens: 100_000 }));
});

/** p0 and two Ds under cache_aware, and a conversation's first turn sent: the D that holds it, and the other. */
async function warmAndColdD(name: string) {
  await putNodes(
    [
      { id: "p0", role: "prefill" },
      { id: "d0", role: "decode" },
      { id: "d1", role: "decode" },
    ],
    predicted("cache_aware"),
  );
  await poll();
  const turn = conversation(name);
  const warm = (await sendChat(turn(1))).d!;
  return { turn, warm, cold: warm === "d0" ? "d1" : "d0" };
}

describe("predicted: the D predicted soonest, not the one holding the most of the prompt", () => {
  it("a warm D with a long queue is passed over for a cold one predicted faster", async () => {
    const { turn, warm, cold } = await warmAndColdD("queued-d");
    const idle = await explain(turn(2));
    expect(idle).toMatchObject({ reason: "predicted", decode: { id: warm } });

    // the warm D's engine has 40 requests waiting (decode legs the router did not send there: KV
    // pulls ahead of this turn's on D's link) that delay this turn's first token
    await setMetrics(warm, kv(0.1, { waiting: 40, capacityTokens: 100_000 }));
    await poll();
    const route = await explain(turn(2));
    expect(route).toMatchObject({ mode: "disaggregated", reason: "predicted", decode: { id: cold, rule: "predicted" } });
    const d = byId(route.candidates.decode);
    // it holds more of the prompt, and is predicted slower
    expect(d[warm].uncachedTokens).toBeLessThan(d[cold].uncachedTokens);
    expect(d[warm].predictedTtftMs).toBeGreaterThan(d[cold].predictedTtftMs);
    expect(route.predictedTtftMs).toBeCloseTo(d[cold].predictedTtftMs, 0);
    expect((await sendChat(turn(2))).d).toBe(cold);
  });
});

describe("predicted: a waiting request the router did not send is one of the node's own sequences, not this prompt", () => {
  it("a warm D whose engine waits on legs as short as those it decodes keeps a long turn (taking each as this turn's size sent it to a cold D)", async () => {
    const { turn, warm, cold } = await warmAndColdD("short-waiting");
    // a short request (a few tokens) that D `warm` decodes, and never finishes: a sequence decoding
    // there (the cold D's KV full meanwhile, so the guard sends it to the warm one)
    await setMetrics(cold, kv(0.95, { capacityTokens: 100_000 }));
    await poll();
    await engineFault(warm, { mode: "hang", count: 1 });
    const client = new AbortController();
    const pending = post("/v1/chat/completions", chatBody("ok"), { signal: client.signal }).catch((e: unknown) => e);
    await waitFor(`${warm} decoding`, snapshot, (s) => s.nodes.find((n) => n.id === warm)!.inflight.decode === 1);

    await setMetrics(cold, kv(0.1, { capacityTokens: 100_000 }));
    // its engine has 12 legs waiting that the router did not send it as prefills (vLLM's
    // WAITING_FOR_REMOTE_KVS, or sequences preempted for KV): sized as the sequences it decodes,
    // a few tokens each — not 12 pulls of this ~3,100-token turn (~490 ms at the profile's transfer rate)
    await setMetrics(warm, kv(0.1, { waiting: 12, capacityTokens: 100_000 }));
    await poll();
    try {
      const route = await explain(turn(2));
      // kept on the warm D (prefilling there alone or after P: either lacks less than the cold D)
      expect(route).toMatchObject({ reason: "predicted", decode: { id: warm } });
      const d = byId(route.candidates.decode);
      expect(d[warm].uncachedTokens).toBeLessThan(d[cold].uncachedTokens);
      expect(d[warm].predictedTtftMs).toBeLessThan(d[cold].predictedTtftMs);
    } finally {
      client.abort();
      await pending;
      await waitFor("released", snapshot, (s) => s.leases === 0);
    }
  });
});

/** A prefill-only P, a `both` node and a decode-only D, neither of the last two prefilling alone. */
const P_BOTH_D = [
  { id: "p0", role: "prefill" as const },
  { id: "c0", role: "both" as const, localPrefill: false },
  { id: "d0", role: "decode" as const, localPrefill: false },
];

describe("predicted: a both node's own prefills do not make it a busy D", () => {
  it("the prefill legs a both node runs as a P are priced by the prediction, not counted as a decode queue: the request is routed, not held at the edge", async () => {
    const nodes = P_BOTH_D;
    // p0's engine has a long queue of its own: cold prompts take c0 as their P and d0 as their D
    await setMetrics("p0", kv(0.1, { waiting: 40, capacityTokens: 100_000 }));
    await putNodes(nodes, { policy: { prefill: "affinity", decode: "affinity", disaggregation: "predicted" }, signals: { ...signals, queueBusy: 2 } });
    await poll();
    // c0's engine holds both prompts until their clients leave: no window the test must beat
    await engineFault("c0", { mode: "hang", count: 2 });
    const clients = [new AbortController(), new AbortController()];
    const held = ["own-a", "own-b"].map((name, i) => post("/v1/chat/completions", conversation(name)(1), { signal: clients[i]!.signal }).catch((e: unknown) => e));
    await waitFor(
      "c0's two prefill legs",
      async () => (await completionsTo("c0")).length,
      (n) => n >= 2,
    );

    // both engines report queueBusy waiting: c0's are the two prefills the router sent it as a P, d0's are not the router's
    await setMetrics("c0", kv(0.1, { waiting: 2, capacityTokens: 100_000 }));
    await setMetrics("d0", kv(0.1, { waiting: 2, capacityTokens: 100_000 }));
    await poll();
    const route = await explain(conversation("own-c")(1));
    expect(route.admission).toEqual({ wait: false });
    expect(route).toMatchObject({ mode: "disaggregated", reason: "predicted", prefill: { id: "p0" }, decode: { id: "c0" } });
    const d = byId(route.candidates.decode);
    expect(d.d0.busy).toBe(true);
    expect(d.c0.busy).toBe(false);
    // the two held requests went P c0, D d0
    const s = await snapshot();
    expect(s.nodes.find((n) => n.id === "c0")!.inflight.prefill).toBe(2);
    expect(s.nodes.find((n) => n.id === "d0")!.inflight.decode).toBe(2);
    for (const c of clients) c.abort();
    await Promise.all(held);
  });
});

describe("predicted: the prefills running on a node are priced at their own context", () => {
  it("a long cold prompt prefilling on a both node weighs on every option through it at its own context, not the short request's", async () => {
    const nodes = P_BOTH_D;
    // p0's engine has a long queue of its own: the long prompt takes c0 as its P
    await setMetrics("p0", kv(0.1, { waiting: 40, capacityTokens: 100_000 }));
    await putNodes(nodes, predicted());
    await poll();
    const long = chatBody(`${"the long cold prompt of an agent, ".repeat(5_000)}`);
    const tokens = byId((await explain(long)).candidates.prefill).c0.uncachedTokens as number;
    expect(tokens).toBeGreaterThan(30_000);
    // c0's engine holds the prompt until the client leaves: no window the test must beat
    await engineFault("c0", { mode: "hang", count: 1 });
    const client = new AbortController();
    const pending = post("/v1/chat/completions", long, { signal: client.signal }).catch((e: unknown) => e);
    // routed P c0, D d0
    await waitFor(
      "c0 prefilling the long prompt for d0",
      snapshot,
      (s) => s.nodes.find((n) => n.id === "c0")!.inflight.prefill === 1 && s.nodes.find((n) => n.id === "d0")!.inflight.decode === 1,
    );

    const route = await explain(chatBody("a short question"));
    const c0 = byId(route.candidates.prefill).c0;
    // at the profile's 10,000 tokens/s: the long prompt's tokens with attention over their own
    // context (x ~2.7 at ~34k tokens); priced at the short request's it was ~its tokens alone
    const ownContext = tokens * (1 + tokens / 2 / ATTENTION_CONTEXT_TOKENS) * 0.1;
    expect(c0.predictedTtftMs).toBeGreaterThanOrEqual(ownContext);
    expect(c0.predictedTtftMs).toBeLessThan(ownContext * 1.2);
    client.abort();
    await pending;
  });
});

describe("predicted: on a pool of both nodes the decode policy's D alone is the pick", () => {
  it("a request the two policies rank onto different both nodes prefills alone on the decode policy's node, as colocated serving would, not split between them", async () => {
    // two `both` nodes (sim engines that prefill alone what comes without a transfer)
    const nodes = [
      { id: "d0", role: "both" as const },
      { id: "d1", role: "both" as const },
    ];
    const turns = Array.from({ length: 16 }, (_, k) => conversation(`all-both-${k}`));
    // the policies' own picks (affinity: fixed keys), read with every request split
    await putNodes(nodes, { ...predicted(), policy: { prefill: "affinity", decode: "affinity", disaggregation: "always" } });
    await poll();
    const picks: Array<{ p: string; d: string }> = [];
    for (const t of turns) {
      const r = await explain(t(1));
      picks.push({ p: r.prefill.id, d: r.decode.id });
    }
    // the case this test is about: some conversation the prefill policy puts on the other node
    expect(picks.some((x) => x.p !== x.d)).toBe(true);

    // predicted, nothing queued or decoding anywhere: a split pays D's hand-off and the transfer,
    // within 20% of D alone; on a pool of both nodes D alone is the pick, not the policies' pair
    await putNodes(nodes, predicted());
    await poll();
    for (const [k, t] of turns.entries()) {
      const r = await explain(t(1));
      expect(r, `conversation ${k}`).toMatchObject({ mode: "local", reason: "predicted", decode: { id: picks[k]!.d } });
    }
  });
});

describe("predicted: a both node as P pays the decode harm of the prefill it would run", () => {
  it("/v1/route shows decodeHarmMs on a both node's P figure while it decodes a stream, and none on a prefill-only P", async () => {
    const nodes = P_BOTH_D;
    await putNodes(nodes, predicted());
    await poll();
    // a conversation the policies send P p0 then D c0 (affinity: a fixed key, found by dry runs)
    let turn: ((i: number) => object) | undefined;
    for (let k = 0; k < 40 && !turn; k++) {
      const candidate = conversation(`harm-${k}`);
      const r = await explain(candidate(1));
      if (r.mode === "disaggregated" && r.prefill.id === "p0" && r.decode.id === "c0") turn = candidate;
    }
    if (!turn) throw new Error("no conversation went p0 -> c0 in 40 tries");
    // c0 decodes it and never finishes: a sequence decoding there
    await engineFault("c0", { mode: "hang", count: 1 });
    const client = new AbortController();
    const pending = post("/v1/chat/completions", turn(1), { signal: client.signal }).catch((e: unknown) => e);
    await waitFor("c0 decoding", snapshot, (s) => s.nodes.find((n) => n.id === "c0")!.inflight.decode === 1 && s.nodes.find((n) => n.id === "p0")!.inflight.prefill === 0);
    const route = await explain(conversation("harm-other")(1));
    const p = byId(route.candidates.prefill);
    expect(p.c0.decodeHarmMs).toBeGreaterThan(0);
    expect(p.p0.decodeHarmMs).toBeUndefined();
    client.abort();
    await pending;
    await waitFor("released", snapshot, (s) => s.leases === 0);
  });
});

describe("predicted: a new sequence's decode load on decode-only Ds", () => {
  it("a D decoding a sequence is priced for the steps a new one lengthens there: /v1/route shows decodeLoadMs on it, and a request the policies put there goes to the idle D", async () => {
    // P then D only: a local option on d0 would pay the decode harm of its prefill beside the sequence there
    const nodes = [
      { id: "p0", role: "prefill" as const },
      { id: "d0", role: "decode" as const, localPrefill: false },
      { id: "d1", role: "decode" as const, localPrefill: false },
    ];
    await putNodes(nodes, predicted());
    await poll();
    // two conversations the policies send to d0 (affinity: fixed keys, found by dry runs)
    const toD0: Array<(i: number) => object> = [];
    for (let k = 0; k < 60 && toD0.length < 2; k++) {
      const candidate = conversation(`load-${k}`);
      if ((await explain(candidate(1))).decode.id === "d0") toD0.push(candidate);
    }
    if (toD0.length < 2) throw new Error("no two conversations went to d0 in 60 tries");
    // d0 decodes the first and never finishes: a sequence decoding there
    await engineFault("d0", { mode: "hang", count: 1 });
    const client = new AbortController();
    const pending = post("/v1/chat/completions", toD0[0]!(1), { signal: client.signal }).catch((e: unknown) => e);
    // the hung stream is ended whatever an assertion says: a sequence left on d0 would be the next test's
    try {
      await waitFor("d0 decoding", snapshot, (s) => s.nodes.find((n) => n.id === "d0")!.inflight.decode === 1);
      // with steps that do not grow with the batch (the profile's flat prior) a sequence costs the others nothing: the policies' pick stays
      const flat = await explain(toD0[1]!(1));
      expect(flat.decode.id).toBe("d0");
      expect(byId(flat.candidates.decode).d0.decodeLoadMs).toBeUndefined();
      // the Ds' streams showed steps growing by ~10 ms a sequence (taught to the object as finished streams would)
      const run = runInDurableObject as unknown as (s: unknown, cb: (instance: any) => void) => Promise<void>;
      await run(stub() as unknown, (instance) => {
        for (const decode of ["d0", "d1"])
          for (const [batch, gapMs] of [
            [1, 10],
            [20, 200],
          ] as const)
            for (let i = 0; i < 4; i++)
              instance.rates.learn(
                {
                  prefiller: "p0",
                  decode,
                  disaggregated: true,
                  aheadCost: 0,
                  promptTokens: 0,
                  cachedTokens: 0,
                  transferTokens: 0,
                  batch,
                  streamEvents: 102,
                  streamSpanMs: gapMs * 100,
                },
                Date.now(),
                () => ({}),
              );
      });
      const route = await explain(toD0[1]!(1));
      const d = byId(route.candidates.decode);
      expect(d.d0.decodeMsPerSeq).toBeGreaterThan(5);
      // ~100 tokens a request (the streams taught it too) x 2 x ~10 ms x the one sequence decoding on d0
      expect(d.d0.decodeLoadMs).toBeGreaterThan(1000);
      expect(d.d1.decodeLoadMs).toBeUndefined();
      expect(route).toMatchObject({ mode: "disaggregated", reason: "predicted", decode: { id: "d1" } });
    } finally {
      client.abort();
      await pending;
      await waitFor("released", snapshot, (s) => s.leases === 0);
    }
  });
});

describe("predicted: admission.ttftSloMs judges the decision's own prediction", () => {
  it("a flex request whose predicted TTFT is over the objective gets 503 slo_unmeetable at once, though a D would take it now; a default one is served; flex is served once the prediction fits", async () => {
    const nodes = [
      { id: "p0", role: "prefill" as const },
      { id: "d0", role: "decode" as const, localPrefill: false },
    ];
    // 40 requests waiting at p0: ~40 prompts of prefill ahead of this one, seconds at the profile's rate
    await setMetrics("p0", kv(0.1, { waiting: 40, capacityTokens: 100_000 }));
    await putNodes(nodes, { ...predicted(), admission: { ttftSloMs: 5000 } });
    await poll();
    const ask = (name: string, tier?: string) => ({ ...conversation(name)(1), ...(tier ? { service_tier: tier } : {}) });
    const route = await explain(ask("slo-a", "flex"));
    expect(route.predictedTtftMs).toBeGreaterThan(5000);
    expect(route.admission).toEqual({ wait: false });

    const before = (await completionsTo("d0")).length;
    const flex = await post("/v1/chat/completions", ask("slo-b", "flex"));
    expect(flex.status).toBe(503);
    expect(flex.headers.get("retry-after")).toMatch(/^[1-9]\d*$/);
    const body = (await flex.json()) as { error: { code: string; message: string } };
    expect(body.error.code).toBe("slo_unmeetable");
    expect(body.error.message).toMatch(/predicted time to first token is about \d+ ms/);
    expect((await completionsTo("d0")).length).toBe(before);
    expect(await sendChat(ask("slo-c"))).toMatchObject({ mode: "disaggregated", p: "p0", d: "d0" });
    const refused = (await snapshot()).admission.rejected.find((r) => r.reason === "slo_unmeetable" && r.tier === "flex");
    expect(refused?.count).toBe(1);

    // p0's queue gone: the prediction fits, and flex is served
    await setMetrics("p0", kv(0.1, { capacityTokens: 100_000 }));
    await poll();
    expect((await explain(ask("slo-d", "flex"))).predictedTtftMs).toBeLessThan(5000);
    expect(await sendChat(ask("slo-d", "flex"))).toMatchObject({ mode: "disaggregated", p: "p0", d: "d0" });
  });
});

describe("predicted: a local prefill needs KV room for the whole prompt", () => {
  it("with P queued, D prefills alone while it has room; without room for the whole prompt it gets the KV from P", async () => {
    await setMetrics("p0", kv(0.1, { waiting: 40, capacityTokens: 100_000 }));
    await putNodes(
      [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
      ],
      predicted(),
    );
    await poll();
    const cold = conversation("kv-room")(1);
    const roomy = await explain(cold);
    expect(roomy).toMatchObject({ mode: "local", reason: "predicted", prefill: { id: "d0", rule: "local_prefill" } });
    expect(byId(roomy.candidates.decode).d0.localTtftMs).toBeGreaterThan(0);

    // 3,000 tokens of KV: the ~3,100-token prompt cannot be prefilled there (the KV guard still lets D take it from P)
    await setMetrics("d0", kv(0.1, { capacityTokens: 3000 }));
    await poll();
    const tight = await explain(cold);
    expect(tight).toMatchObject({ mode: "disaggregated", reason: "predicted", prefill: { id: "p0" }, decode: { id: "d0" } });
    expect(byId(tight.candidates.decode).d0.localTtftMs).toBeNull();
    expect(await sendChat(cold)).toMatchObject({ mode: "disaggregated", p: "p0", d: "d0" });
    expect((await completionsTo("d0")).at(-1)?.kv_transfer_params).toMatchObject({ do_remote_prefill: true });
  });
});

describe("learned rates", () => {
  it("a prefill node made slower is learned (whatever the disaggregation), and predicted disaggregation then prefills on D instead", async () => {
    const nodes = [
      { id: "p0", role: "prefill" as const },
      { id: "d0", role: "decode" as const },
    ];
    // learned under `always`: every request goes through p0
    await putNodes(nodes, { policy: { prefill: "affinity", decode: "affinity" }, signals });
    await poll();
    const tokensPerS = async () => (await snapshot()).nodes.find((n) => n.id === "p0")!.rates!.prefillTokensPerS;
    const ask = (i: number) => conversation(`rate-${i}`)(1);
    for (let i = 0; i < 5; i++) await sendChat(ask(i));
    const before = await waitFor("p0's rate learned", tokensPerS, (v) => v !== 10_000);
    // p0 now takes a second longer to answer each prefill
    const res = await fetch(`${signalsRig().simControlUrl}/engines/p0/fault`, { method: "POST", body: JSON.stringify({ mode: "slow", delayMs: 1000, count: 4 }) });
    expect(res.ok).toBe(true);
    for (let i = 5; i < 9; i++) expect((await sendChat(ask(i))).p).toBe("p0");
    const after = await waitFor("p0's slowness learned", tokensPerS, (v) => v < before / 2);
    expect(after).toBeLessThan(before / 2);
    // predicted: /v1/route shows the slow rate, and d0 (at its profile's rate) prefills the next cold prompt itself
    await putNodes(nodes, predicted());
    const route = await explain(conversation("after-slow")(1));
    expect(byId(route.candidates.prefill).p0.prefillMsPerToken).toBeGreaterThan((1.5 * 1000) / before);
    expect(route).toMatchObject({ mode: "local", reason: "predicted", decode: { id: "d0" } });
  });

  it("a non-streamed answer teaches no transfer and no TTFT: its first byte is its last (the whole decode), a stream's first event is its first token", async () => {
    await putNodes(
      [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
      ],
      predicted(),
    );
    await poll();
    const d0 = async () => (await snapshot()).nodes.find((n) => n.id === "d0")!.rates!;
    const finished = async () => (await snapshot()).requests.reduce((n: number, r: { count: number }) => n + r.count, 0);
    // D's learned transfer: a fixed hand-off and ms a token (/v1/route shows both)
    const transfer = async () => {
      const d = byId((await explain(conversation("probe")(1))).candidates.decode).d0;
      return { handoffMs: d.handoffMs, perGB: (await d0()).transferMsPerGB };
    };
    const prior = await transfer();
    // before D has pulled anything its hand-off is one of its decode steps (node-rates.ts transferLine)
    const unpulled = byId((await explain(conversation("probe")(1))).candidates.decode).d0;
    expect(unpulled.handoffMs).toBeGreaterThan(0);
    expect(unpulled.handoffMs).toBe(unpulled.decodeStepMs);
    // 2,000 tokens decoded before D's JSON answer leaves (hundreds of real ms at the rig's time
    // scale, against a prior transfer of ~40 ms for this prompt): taken as a TTFT, all of it was
    // learned as D's transfer
    for (let i = 0; i < 4; i++) {
      const res = await post("/v1/chat/completions", { ...conversation(`whole-${i}`)(1), max_tokens: 2000 });
      expect(res.status).toBe(200);
      await res.text();
    }
    // the finish reports travel in waitUntil: all four counted, and nothing learned of the transfer
    await waitFor("four finish reports", finished, (n) => n >= 4);
    expect(await transfer()).toEqual(prior);
    expect((await snapshot()).prediction?.count ?? 0).toBe(0);
    // a stream: D's first event is its first token, a TTFT to learn from and to hold the prediction against
    const res = await post("/v1/chat/completions", { ...conversation("streamed")(1), max_tokens: 120, stream: true });
    expect(res.status).toBe(200);
    await res.text();
    expect(
      await waitFor(
        "the stream's finish report",
        async () => (await snapshot()).prediction?.count ?? 0,
        (n) => n === 1,
      ),
    ).toBe(1);
  });

  it("a stream's pace teaches D's decode step (the gaps between its events, as the relay passes them)", async () => {
    await putNodes(
      [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
      ],
      // a prior far from the simulator's steps (a few real ms at its time scale)
      { ...predicted(), profile: { decodeStepMs: 5000 } },
    );
    await poll();
    const step = async () => (await snapshot()).nodes.find((n) => n.id === "d0")!.rates!.decodeStepMs;
    expect(await step()).toBe(5000);
    for (let i = 0; i < 4; i++) {
      const res = await post("/v1/chat/completions", { ...conversation(`pace-${i}`)(1), max_tokens: 40, stream: true });
      expect(res.status).toBe(200);
      await res.text();
    }
    // the finish reports travel in waitUntil
    expect(await waitFor("decode step learned", step, (v) => v < 2500)).toBeLessThan(2500);
  });
});
