// The operators' view of a node's busy window (issue 18 item 6): /status.json and /admin/status say
// until when a node that answered 429/503 asked to be left alone (epoch ms; null: it did not).
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { chat, fault, putCluster, resetClusterState, resetSim } from "./helpers";
import { admin, bearer, call, KEY } from "./ops-helpers";

describe("busyUntil in the node status", () => {
  beforeEach(async () => {
    await resetSim();
    await resetClusterState();
  });
  afterEach(resetSim);

  it("a P that answered 429 with retry-after 60: its busyUntil on /status.json and /admin/status, null for the others", async () => {
    await putCluster({
      protocol: "vllm",
      policy: { prefill: "round_robin", decode: "round_robin" },
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "p1", role: "prefill" },
        { id: "d0", role: "decode" },
      ],
    });
    await fault("p0", {
      mode: "respond",
      status: 429,
      headers: { "content-type": "application/json", "retry-after": "60" },
      body: JSON.stringify({ error: { message: "Too many requests", code: 429 } }),
      count: 1,
    });
    const res = await call("/v1/chat/completions", { method: "POST", headers: { ...bearer(KEY), "content-type": "application/json" }, body: JSON.stringify(chat("rate limited")) });
    expect(res.status).toBe(200);
    expect(res.headers.get("x-pd-prefill")).toBe("p1");
    await res.arrayBuffer();
    for (const path of ["/status.json", "/admin/status"]) {
      const body = (await (await admin(path)).json()) as any;
      const busyUntil = Object.fromEntries(body.nodes.map((n: any) => [n.id, n.busyUntil]));
      expect(busyUntil.p0, path).toBeGreaterThan(Date.now() + 30_000);
      expect(busyUntil.p1, path).toBeNull();
      expect(busyUntil.d0, path).toBeNull();
    }
  });
});
