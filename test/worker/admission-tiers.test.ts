import { SELF } from "cloudflare:test";
import { beforeEach, describe, expect, it } from "vitest";
import { chatBody, engineRequests, kv, poll, post, putNodes, queued, resetEngines, resetState, setMetrics, snapshot, useSignalsRig, waitFor } from "./signals-helpers";

useSignalsRig();

// Service tiers at the edge (SPEC 9): the request's `service_tier` sets its band in the queue of
// requests waiting for a decode node; a flex request that cannot meet admission.ttftSloMs is
// refused at once; vLLM's own `priority` follows the tier on nodes that run priority scheduling.

const PD = [
  { id: "p0", role: "prefill" as const },
  { id: "d0", role: "decode" as const },
  { id: "d1", role: "decode" as const },
];

const decodeLegs = async (id: string) => (await engineRequests(id)).filter((r) => r.path === "/v1/chat/completions");
const idOf = (r: { headers: Record<string, string> }) => r.headers["x-request-id"]?.split("-").slice(0, 2).join("-");
const send = (id: string, body: unknown) => post("/v1/chat/completions", body, { headers: { "content-type": "application/json", "x-request-id": id } });

beforeEach(async () => {
  await resetState();
  await resetEngines();
  for (const id of ["p0", "d0", "d1", "c0"]) await setMetrics(id, kv(0.1));
});

describe("service_tier", () => {
  it("a value other than priority, default, auto or flex: 400 naming the field, nothing routed", async () => {
    await putNodes(PD);
    for (const [path, body] of [
      ["/v1/chat/completions", chatBody("hi", { service_tier: "gold" })],
      ["/v1/completions", { model: "sim-model", prompt: "hi", service_tier: 2 }],
      ["/v1/responses", { model: "sim-model", input: "hi", service_tier: "scale" }],
    ] as const) {
      const res = await post(path, body);
      expect(res.status, path).toBe(400);
      const { error } = (await res.json()) as { error: { param: string; message: string } };
      expect(error.param).toBe("service_tier");
      expect(error.message).toContain("'priority'");
    }
    for (const tier of ["priority", "default", "auto", "flex", null]) {
      const res = await post("/v1/chat/completions", chatBody("ok", { service_tier: tier }));
      expect(res.status, String(tier)).toBe(200);
      await res.arrayBuffer();
    }
    expect((await engineRequests("p0")).length).toBe(5);
  });

  it("flex waits behind default, default behind priority, whatever their arrival", async () => {
    await setMetrics("d1", kv(0.97));
    await setMetrics("d0", kv(0.95));
    await putNodes(PD);
    await poll();
    const answers: Array<Promise<Response>> = [];
    for (const tier of ["flex", "default", "priority"]) {
      // ~34 tokens each: d0 below takes one at a time
      answers.push(send(`tier-${tier}`, chatBody(`${tier} ${"x".repeat(120)}`, { service_tier: tier })));
      await waitFor(`${tier} queued`, queued, (n) => n === answers.length);
    }
    expect((await snapshot()).admission.queuedByTier).toEqual([
      { tier: "priority", count: 1 },
      { tier: "default", count: 1 },
      { tier: "flex", count: 1 },
    ]);
    const text = await (await SELF.fetch("http://router/metrics")).text();
    for (const tier of ["priority", "default", "flex"]) expect(text).toContain(`pd_router_admission_queued{tier="${tier}"} 1`);
    await setMetrics("d0", kv(0.7, { capacityTokens: 200 }));
    await poll();
    for (const res of await Promise.all(answers)) {
      expect(res.status, await res.clone().text()).toBe(200);
      await res.arrayBuffer();
    }
    expect((await decodeLegs("d0")).map(idOf)).toEqual(["tier-priority", "tier-default", "tier-flex"]);
  });

  it("a full queue sheds the lowest tier first: the flex waiter gets 503 cluster_busy at once, having sent nothing upstream", async () => {
    await setMetrics("d0", kv(0.99));
    await setMetrics("d1", kv(0.99));
    await putNodes(PD, { admission: { maxQueued: 1 } });
    await poll();
    const before = await snapshot();
    const shedCount = (s: typeof before) => s.admission.rejected.find((r) => r.reason === "shed" && r.tier === "flex")?.count ?? 0;
    const flex = send("shed-flex", chatBody("flex", { service_tier: "flex" }));
    await waitFor("flex queued", queued, (n) => n === 1);
    const priority = send("shed-priority", chatBody("priority", { service_tier: "priority" }));
    const shed = await flex;
    expect(shed.status).toBe(503);
    expect(shed.headers.get("retry-after")).toMatch(/^[1-9]\d*$/);
    expect(((await shed.json()) as { error: { code: string } }).error.code).toBe("cluster_busy");
    const s = await snapshot();
    expect([s.admission.queued, s.leases, shedCount(s)]).toEqual([1, 0, shedCount(before) + 1]);
    // a default request does not rank before the priority one: refused at once, the queue is full
    const refused = await send("shed-default", chatBody("default"));
    expect(refused.status).toBe(503);
    await refused.arrayBuffer();
    await setMetrics("d1", kv(0.2));
    await poll();
    expect((await priority).status).toBe(200);
    const reached = [...(await engineRequests("p0")), ...(await decodeLegs("d0")), ...(await decodeLegs("d1"))].map(idOf);
    expect(reached.filter((id) => id !== "shed-priority")).toEqual([]);
    await waitFor("released", snapshot, (x) => x.leases === 0 && x.admission.queued === 0);
  });

  it("admission.ttftSloMs: a flex request predicted to miss it gets 503 slo_unmeetable at once; a default one waits", async () => {
    await putNodes(PD, { admission: { ttftSloMs: 1 } });
    // one request through: the pool has seen a lease end, so the queue's wait can be estimated
    const through = await send("slo-warm", chatBody("warm"));
    expect(through.status).toBe(200);
    await through.arrayBuffer();
    await waitFor("released", snapshot, (s) => s.leases === 0);
    await setMetrics("d0", kv(0.99));
    await setMetrics("d1", kv(0.99));
    await poll();
    const before = await snapshot();
    const flex = await send("slo-flex", chatBody("flex", { service_tier: "flex" }));
    expect(flex.status).toBe(503);
    expect(flex.headers.get("retry-after")).toMatch(/^[1-9]\d*$/);
    expect(((await flex.json()) as { error: { code: string } }).error.code).toBe("slo_unmeetable");
    const waiting = send("slo-default", chatBody("default"));
    await waitFor("the default one queued", queued, (n) => n === 1);
    const after = await snapshot();
    const count = (s: typeof after) => s.admission.rejected.find((r) => r.reason === "slo_unmeetable" && r.tier === "flex")?.count ?? 0;
    expect(count(after)).toBe(count(before) + 1);
    expect((await decodeLegs("d0")).length + (await decodeLegs("d1")).length).toBe(1);
    await setMetrics("d1", kv(0.2));
    await poll();
    expect((await waiting).status).toBe(200);
  });
});

describe("admission.priorityReserve", () => {
  it("keeps a share of each D's KV for priority: at 0.85 KV a default request waits at the edge, a priority one is routed at once", async () => {
    await setMetrics("d0", kv(0.85));
    await setMetrics("d1", kv(0.85));
    // kvBusy 0.9 less a reserve of 0.1: the others see the Ds as busy from 0.8
    await putNodes(PD, { admission: { priorityReserve: 0.1 } });
    await poll();
    const waiting = send("reserve-default", chatBody("default", { service_tier: "default" }));
    await waitFor("the default request queued", queued, (n) => n === 1);
    const priority = await send("reserve-priority", chatBody("priority", { service_tier: "priority" }));
    expect(priority.status, await priority.clone().text()).toBe(200);
    await priority.arrayBuffer();
    expect(await queued()).toBe(1);
    expect((await decodeLegs("d0")).concat(await decodeLegs("d1")).map(idOf)).toEqual(["reserve-priority"]);
    // below the reserve's line again: the default request goes
    await setMetrics("d0", kv(0.5));
    await poll();
    const res = await waiting;
    expect(res.status, await res.clone().text()).toBe(200);
    await res.arrayBuffer();
  });

  it("without it (the default, 0) the same default request is routed at once", async () => {
    await setMetrics("d0", kv(0.85));
    await setMetrics("d1", kv(0.85));
    await putNodes(PD);
    await poll();
    const res = await send("no-reserve", chatBody("default", { service_tier: "default" }));
    expect(res.status, await res.clone().text()).toBe(200);
    await res.arrayBuffer();
  });
});

describe("vLLM's priority field", () => {
  const bodyOf = async (id: string) => (await engineRequests(id)).map((r) => JSON.parse(r.body) as Record<string, unknown>);

  it("set from the tier on nodes with priorityScheduling (a client's own value replaced), never elsewhere", async () => {
    await putNodes([
      { id: "p0", role: "prefill" },
      { id: "d0", role: "decode", priorityScheduling: true },
    ] as never);
    for (const [tier, extra] of [
      ["flex", {}],
      ["default", { priority: -100 }],
      ["priority", {}],
    ] as const) {
      const res = await send(`prio-${tier}`, chatBody(tier, { service_tier: tier, ...extra }));
      expect(res.status, await res.clone().text()).toBe(200);
      await res.arrayBuffer();
    }
    expect((await bodyOf("d0")).map((b) => [b.service_tier, b.priority])).toEqual([
      ["flex", 1],
      ["default", 0],
      ["priority", -1],
    ]);
    // P runs no priority scheduling: the client's bytes as they were (its own priority included)
    expect((await bodyOf("p0")).map((b) => b.priority)).toEqual([undefined, -100, undefined]);
  });

  it("a document whose nodes declare nothing: the body is the client's", async () => {
    await putNodes(PD);
    const res = await send("prio-none", chatBody("none", { service_tier: "priority" }));
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    const [leg] = await decodeLegs("d0").then(async (d0) => (d0.length ? d0 : decodeLegs("d1")));
    expect(JSON.parse(leg!.body)).not.toHaveProperty("priority");
  });
});
