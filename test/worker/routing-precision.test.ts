// Routing precision, the request history and the prediction's receipt through the Worker (SPEC 9,
// issue 23 items 2 and 6): a follow-up turn counts as precise when the engine that prefilled it
// reported cached tokens covering the previous turn's prompt, whatever the policy.
import { env, runDurableObjectAlarm, SELF } from "cloudflare:test";
import { beforeEach, describe, expect, it } from "vitest";
import { fault, post, putCluster, resetClusterState, resetSim } from "./helpers";
import { conversations } from "../support/conversation";

/** A conversation of 6 prefix blocks (~3,100 tokens): its turns share whole blocks */
// a fixed suffix: every file starts from fresh engines and a clean router (docs/testing.md), and a
// random one would move the conversations' hashes, and with them the nodes they meet, run to run
const conversation = conversations("rprec");
const stub = () => env.CLUSTER_STATE.get(env.CLUSTER_STATE.idFromName("cluster"));

async function send(body: unknown) {
  const res = await post("/v1/chat/completions", body);
  const text = await res.text();
  expect(res.status, text).toBe(200);
  return { p: res.headers.get("x-pd-prefill")!, d: res.headers.get("x-pd-decode")!, usage: JSON.parse(text).usage };
}

/** The value of one series in /metrics (METRICS_TOKEN is not set in this project). */
async function metric(series: string): Promise<number | null> {
  const text = await (await SELF.fetch("http://router/metrics")).text();
  const line = text.split("\n").find((l) => l.startsWith(`${series} `));
  return line === undefined ? null : Number(line.slice(series.length + 1));
}

/** Finish reports travel in waitUntil: wait until the object counted `followUps`. */
async function precisionOf(followUps: number) {
  const deadline = Date.now() + 5000;
  for (;;) {
    const p = (await stub().snapshot()).precision?.[0];
    if ((p && p.followUps >= followUps) || Date.now() > deadline) return p;
    await new Promise((r) => setTimeout(r, 25));
  }
}

beforeEach(async () => {
  await resetSim();
  // also what earlier tests taught the object: conversations seen, follow-ups counted, rates
  await resetClusterState();
});

describe("routing precision", () => {
  it("counts a follow-up that landed on its prefix as precise, and one that failed over to a cold P as not", async () => {
    // affinity (not cache_aware): precision is counted whatever the policy
    await putCluster({
      protocol: "vllm",
      policy: { prefill: "affinity", decode: "affinity" },
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "p1", role: "prefill" },
        { id: "d0", role: "decode" },
      ],
    });
    expect(await metric('pd_router_routing_precision{pool="all"}')).toBe(0);
    const landed = conversation("landed");
    const one = await send(landed(1));
    const two = await send(landed(2));
    expect(two.p).toBe(one.p);
    expect(two.usage.prompt_tokens_details.cached_tokens).toBeGreaterThanOrEqual(2048);
    expect(await precisionOf(1)).toEqual({ pool: "all", followUps: 1, precise: 1 });

    // the next conversation's P fails on its second turn: the other P, cold, prefills it
    const moved = conversation("moved");
    const first = await send(moved(1));
    await fault(first.p, { mode: "status500", count: 1 });
    const second = await send(moved(2));
    expect(second.p).not.toBe(first.p);
    expect(await precisionOf(2)).toEqual({ pool: "all", followUps: 2, precise: 1 });
    expect(await metric('pd_router_routing_precision{pool="all"}')).toBe(0.5);
    // the engines' cached tokens are counted under affinity too (no prefix index)
    expect(await metric(`pd_router_prefix_cached_tokens_total{node="${one.p}"}`)).toBeGreaterThanOrEqual(2048);
  });
});

describe("the status page's history keeps request rates", () => {
  it("each point carries the requests routed so far, per node and in all, so a page opened after traffic shows them", async () => {
    await putCluster({
      protocol: "vllm",
      policy: { prefill: "round_robin", decode: "round_robin" },
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
      ],
    });
    for (let i = 0; i < 4; i++) await send(conversation(`history-${i}`)(1));
    await runDurableObjectAlarm(stub() as never);
    const history = (await stub().snapshot(undefined, true)).history;
    const last = history.at(-1)!;
    expect(last.routed).toBeGreaterThanOrEqual(4);
    expect(Object.fromEntries(last.nodes.map((n) => [n.node, n.requests]))).toMatchObject({ p0: expect.any(Number), d0: expect.any(Number) });
    expect(last.nodes.find((n) => n.node === "d0")!.requests).toBeGreaterThanOrEqual(4);
  });
});

describe("the prediction's receipt", () => {
  it("a predicted request's actual / predicted TTFT is counted in pd_router_ttft_prediction_ratio", async () => {
    await putCluster({
      protocol: "vllm",
      policy: { prefill: "affinity", decode: "affinity", disaggregation: "predicted" },
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
      ],
    });
    const route = await (await post("/v1/route", conversation("receipt")(1))).json<any>();
    expect(route.predictedTtftMs).toBeGreaterThan(0);
    expect(route.candidates.decode[0]).toMatchObject({ id: "d0", predictedTtftMs: expect.any(Number), decodeStepMs: expect.any(Number) });
    // streamed: D's first event is the first token, the TTFT the prediction is held against (a
    // non-streamed answer's first byte is its last, and is not counted)
    const res = await post("/v1/chat/completions", { ...conversation("receipt")(1), stream: true });
    expect(res.status).toBe(200);
    await res.text();
    const deadline = Date.now() + 5000;
    while (((await metric("pd_router_ttft_prediction_ratio_count")) ?? 0) < 1 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 25));
    expect(await metric("pd_router_ttft_prediction_ratio_count")).toBe(1);
  });
});
