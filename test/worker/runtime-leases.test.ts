// A request the runtime dropped: its lease expires, is released and counted as a 499 with a
// `lease_expired` log line naming the request (docs/lifecycle.md, the life cycle, 6). LEASE_TTL_MS
// is 1 s in the worker-runtime project (vitest.config.ts).
//
// No client can make workerd drop a live request from outside (a request that lives renews its
// lease; one whose client leaves ends and releases it), so this test takes the lease the way a
// request does — the route call of the Worker, with a lease id and a request id — and then does
// what a dropped request does: nothing. Everything after that is observed through the Worker.
import { env, SELF } from "cloudflare:test";
import { afterEach, describe, expect, it, vi } from "vitest";
import type { RouteRequest, RouteResponse } from "../../src/state/types";
import { chat, post, putCluster, resetSim, snapshot } from "./helpers";
import { eventually, seriesValue } from "./ops-helpers";

const auth = { authorization: "Bearer runtime-key" };

describe("a lease whose request stopped renewing expires", () => {
  afterEach(() => vi.restoreAllMocks());

  it("is released, logged lease_expired with its request id, counted as a 499 and in pd_router_leases_expired_total", async () => {
    await resetSim();
    await putCluster({
      protocol: "vllm",
      policy: { prefill: "round_robin", decode: "round_robin" },
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
      ],
    });
    // a live request first: the object learns the document, and a request that lives and ends is no expiry
    const live = await post("/v1/chat/completions", chat("a request that ends"), auth);
    expect(live.status).toBe(200);
    await live.text();
    const warnings: string[] = [];
    vi.spyOn(console, "warn").mockImplementation((...args: unknown[]) => void warnings.push(args.map(String).join(" ")));

    const stub = env.CLUSTER_STATE.get(env.CLUSTER_STATE.idFromName("cluster")) as unknown as { route(r: RouteRequest): Promise<RouteResponse> };
    const taken = await stub.route({
      version: (await snapshot()).version!,
      model: "sim-model",
      key: null,
      prefixHashes: [],
      tokens: 123,
      dryRun: false,
      leaseId: "lease-of-a-dropped-request",
      requestId: "dropped-request-1",
      route: "/v1/chat/completions",
    });
    expect(taken.ok).toBe(true);
    const metrics = async () => (await SELF.fetch("http://router/metrics")).text();
    const held = await metrics();
    expect(seriesValue(held, "pd_router_leases")).toBe(1);
    expect(seriesValue(held, 'pd_router_node_inflight_tokens{node="d0"}')).toBe(123);

    // nobody renews it: after LEASE_TTL_MS it is gone, counted and logged (generous deadline)
    const after = await eventually(async () => {
      const text = await metrics();
      expect(seriesValue(text, "pd_router_leases_expired_total")).toBe(1);
      return text;
    }, 10_000);
    expect(seriesValue(after, "pd_router_leases")).toBe(0);
    expect(seriesValue(after, 'pd_router_node_inflight{node="p0"}')).toBe(0);
    expect(seriesValue(after, 'pd_router_node_inflight{node="d0"}')).toBe(0);
    expect(seriesValue(after, 'pd_router_node_inflight_tokens{node="d0"}')).toBe(0);
    expect(seriesValue(after, 'pd_router_requests_total{route="/v1/chat/completions",status="499"}')).toBe(1);
    expect(seriesValue(after, 'pd_router_requests_total{route="/v1/chat/completions",status="200"}')).toBe(1);
    const expired = warnings.map((l) => JSON.parse(l)).filter((e) => e.event === "lease_expired");
    expect(expired).toEqual([expect.objectContaining({ requestId: "dropped-request-1", leaseId: "lease-of-a-dropped-request", prefill: "p0", decode: "d0" })]);

    // a request that lives longer than LEASE_TTL_MS renews its lease and never expires
    await putCluster({
      protocol: "vllm",
      policy: { prefill: "round_robin", decode: "round_robin" },
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "slow", role: "decode" },
      ],
    });
    const long = await post("/v1/chat/completions", chat("a long stream", { stream: true, max_tokens: 150 }), auth);
    expect(long.status).toBe(200);
    expect(await long.text()).toContain("[DONE]");
    const end = await metrics();
    expect(seriesValue(end, "pd_router_leases_expired_total")).toBe(1);
    expect(seriesValue(end, "pd_router_leases")).toBe(0);
  });
});
