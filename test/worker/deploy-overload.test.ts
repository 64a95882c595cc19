// Issue 18 item 6: overload is not failure. An engine (or the gateway in front of it) that
// answers 503 or 429 is full, not broken: the request fails over to the next node and the busy
// node is counted neither towards ejection nor as failed, so a load spike cannot eject every
// decode node. When every node tried is busy the client gets 503 `upstream_busy` with a
// `retry-after`: the shortest any of them asked for (1 s when none did).
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { chat, expectNoLoad, fault, post, putCluster, received, resetClusterState, resetSim, snapshot } from "./helpers";

const rr = { prefill: "round_robin", decode: "round_robin" };
const busy = (retryAfter: string | null, status = 503) => ({
  mode: "respond",
  status,
  headers: { "content-type": "application/json", ...(retryAfter === null ? {} : { "retry-after": retryAfter }) },
  body: JSON.stringify({ error: { message: "The request queue is full.", type: "ServiceUnavailable", code: status } }),
});
const node = async (id: string) => (await snapshot()).nodes.find((n) => n.id === id)!;

describe("6. a busy node is skipped, not ejected", () => {
  beforeEach(async () => {
    await resetSim();
    await resetClusterState();
  });
  afterEach(resetSim);

  it("a D answering 503 to every request: all requests go to the other D, and the busy D is neither failed nor ejected", async () => {
    await putCluster({
      protocol: "vllm",
      policy: rr,
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
        { id: "d1", role: "decode" },
      ],
    });
    // retry-after 0: no window to honour (deploy-busy-window.test.ts), so d0 is asked again each time;
    // more than ejectAfter (3) busy answers in a row
    await fault("d0", busy("0"));
    for (let i = 0; i < 8; i++) {
      const res = await post("/v1/chat/completions", chat(`spike ${i}`));
      expect(res.status).toBe(200);
      expect(res.headers.get("x-pd-decode")).toBe("d1");
      await res.arrayBuffer();
    }
    expect((await received("d0")).filter((r) => r.path === "/v1/chat/completions").length).toBeGreaterThanOrEqual(4);
    const d0 = await node("d0");
    expect(d0.failuresTotal).toBe(0);
    expect(d0.breaker).toBe("closed");
    expect(d0.healthy).toBe(true);
    await expectNoLoad();
  });

  it("a P answering 429 (a rate limiter in front of it): the next P prefills, nothing counted against the first", async () => {
    await putCluster({
      protocol: "vllm",
      policy: rr,
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "p1", role: "prefill" },
        { id: "d0", role: "decode" },
      ],
    });
    await fault("p0", busy(null, 429));
    for (let i = 0; i < 4; i++) {
      const res = await post("/v1/chat/completions", chat(`limited ${i}`));
      expect(res.status).toBe(200);
      expect(res.headers.get("x-pd-prefill")).toBe("p1");
      await res.arrayBuffer();
    }
    expect((await node("p0")).failuresTotal).toBe(0);
    await expectNoLoad();
  });

  it("every D busy: 503 upstream_busy with the shortest retry-after the nodes gave; still nothing counted as failed", async () => {
    await putCluster({
      protocol: "vllm",
      policy: rr,
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
        { id: "d1", role: "decode" },
      ],
    });
    await fault("d0", busy("7"));
    await fault("d1", busy("3"));
    const res = await post("/v1/chat/completions", chat("all busy"));
    expect(res.status).toBe(503);
    expect(res.headers.get("retry-after")).toBe("3");
    const { error } = (await res.json()) as any;
    expect(error.code).toBe("upstream_busy");
    expect((await node("d0")).failuresTotal + (await node("d1")).failuresTotal).toBe(0);
    await expectNoLoad();
  });

  it("every node busy without a retry-after: the client is told 1 s", async () => {
    await putCluster({ protocol: "colocated", nodes: [{ id: "c0", role: "both" }] });
    await fault("c0", busy(null));
    const res = await post("/v1/chat/completions", chat("busy, no hint"));
    expect(res.status).toBe(503);
    expect(res.headers.get("retry-after")).toBe("1");
    await res.arrayBuffer();
    await expectNoLoad();
  });
});
