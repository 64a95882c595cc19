import http from "node:http";
import type { AddressInfo } from "node:net";
import type { TestProject } from "vitest/node";
// @ts-expect-error plain JS module of the simulator
import { startSimCluster } from "../sim/cluster.mjs";
import { startMetricsFront, type MetricsFront, type MetricsMode } from "./support/metrics-front";

// Nodes for the engine-signals tests (test/worker/signals-*.test.ts): simulated engines behind
// small fronts that answer GET /metrics themselves, steered through a control server (the tests
// run inside workerd and can only speak HTTP). Each test file gets a rig of its own, as every
// Worker test file gets its own engines (test/global-setup.ts says why): files may run in
// parallel, and one file's /metrics override must never reach another's router.
const NODES = [
  { id: "p0", role: "prefill" },
  { id: "d0", role: "decode" },
  { id: "d1", role: "decode" },
  { id: "c0", role: "both" },
] as const;

interface Rig {
  cluster: { controlUrl: string; engines: Map<string, { url: string }>; close(): Promise<void> };
  fronts: Map<string, MetricsFront>;
}

export default async function setup(project: TestProject) {
  const rigs = new Map<string, Rig>();
  let next = 0;
  const close = async (rig: Rig) => {
    await Promise.all([...rig.fronts.values()].map((f) => f.close()));
    await rig.cluster.close();
  };
  const control = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const reply = (status: number, body: unknown) => {
        res.writeHead(status, { "content-type": "application/json" });
        res.end(JSON.stringify(body));
      };
      const fail = (err: unknown) => reply(500, { error: String(err) });
      const [, kind, rigId, sub, id, what] = (req.url ?? "").split("/");
      if (kind !== "rigs") return reply(404, { error: "unknown control" });
      if (req.method === "POST" && !rigId) {
        // a new rig: engines and their fronts, for one test file
        (async () => {
          const cluster = await startSimCluster({ defaults: { timeScale: 0.01 }, engines: NODES.map((n) => ({ ...n })) });
          const fronts = new Map<string, MetricsFront>();
          for (const n of NODES) fronts.set(n.id, await startMetricsFront(cluster.engines.get(n.id).url));
          const key = String(++next);
          rigs.set(key, { cluster, fronts });
          const { port } = control.address() as AddressInfo;
          return {
            id: key,
            controlUrl: `http://127.0.0.1:${port}/rigs/${key}`,
            simControlUrl: cluster.controlUrl,
            nodes: Object.fromEntries([...fronts].map(([n, f]) => [n, f.url])),
          };
        })().then((rig) => reply(200, rig), fail);
        return;
      }
      const rig = rigs.get(rigId ?? "");
      if (!rig) return reply(404, { error: `no rig ${rigId}` });
      if (req.method === "DELETE" && !sub) {
        rigs.delete(rigId!);
        close(rig).then(() => reply(200, { ok: true }), fail);
        return;
      }
      const front = sub === "fronts" ? rig.fronts.get(id ?? "") : undefined;
      if (!front) return reply(404, { error: `no front ${id}` });
      if (req.method === "POST" && what === "metrics") {
        front.set(JSON.parse(Buffer.concat(chunks).toString("utf8")) as MetricsMode);
        return reply(200, { ok: true });
      }
      if (req.method === "GET" && what === "stats") return reply(200, front.stats());
      reply(404, { error: "unknown control" });
    });
  });
  await new Promise<void>((resolve) => control.listen(0, "127.0.0.1", resolve));
  project.provide("signalsFactory", `http://127.0.0.1:${(control.address() as AddressInfo).port}`);
  return async () => {
    control.closeAllConnections();
    await new Promise<void>((resolve) => control.close(() => resolve()));
    await Promise.all([...rigs.values()].map(close));
  };
}
