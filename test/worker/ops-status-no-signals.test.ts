import { env, runDurableObjectAlarm } from "cloudflare:test";
import { describe, expect, it } from "vitest";
import { control, putCluster } from "./helpers";
import { admin } from "./ops-helpers";

// A node that answers its probes but whose /metrics gives no reading (SGLang started without
// --enable-metrics has no /metrics route: 404) is named in /status.json — the status page's data —
// per node (`noSignals`) and in `warnings`, which the page lists (issue 24, item 3).

describe("/status.json names a node that gives no signals", () => {
  it("after three polls of a d0 whose /metrics answers 404 while its probes pass", async () => {
    await putCluster({
      protocol: "vllm",
      health: { intervalMs: 600_000 },
      signals: { intervalMs: 600_000, staleMs: 1_200_000 },
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
      ],
    });
    await control("/engines/d0/metrics-fault", { mode: "status", status: 404 });
    try {
      // the first status read hands the document to the object; each early alarm run probes and polls every node
      expect((await admin("/status.json")).status).toBe(200);
      const stub = env.CLUSTER_STATE.get(env.CLUSTER_STATE.idFromName("cluster"));
      for (let i = 0; i < 3; i++) await runDurableObjectAlarm(stub as never);
      const data = (await (await admin("/status.json")).json()) as any;
      const byId = Object.fromEntries(data.nodes.map((n: any) => [n.id, n]));
      expect(byId.d0).toMatchObject({ probeUp: true, noSignals: true });
      expect(byId.p0).toMatchObject({ noSignals: false });
      expect(data.warnings).toContainEqual(expect.stringMatching(/^node d0 answers its probes but its \/metrics gave no reading in 3 polls: .*--enable-metrics/));
    } finally {
      await control("/engines/d0/metrics-fault", { mode: "none" });
    }
  });
});
