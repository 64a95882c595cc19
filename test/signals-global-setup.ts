import http from "node:http";
import type { AddressInfo } from "node:net";
import type { TestProject } from "vitest/node";
// @ts-expect-error plain JS module of the simulator
import { startSimCluster } from "../sim/cluster.mjs";
import { startMetricsFront, type MetricsFront, type MetricsMode } from "./support/metrics-front";

// Nodes for the engine-signals tests (test/worker/signals-*.test.ts): simulated engines behind
// small fronts that answer GET /metrics themselves, steered through a control server (the tests
// run inside workerd and can only speak HTTP).
const NODES = [
  { id: "p0", role: "prefill" },
  { id: "d0", role: "decode" },
  { id: "d1", role: "decode" },
  { id: "c0", role: "both" },
] as const;

export default async function setup(project: TestProject) {
  const cluster = await startSimCluster({ defaults: { timeScale: 0.01 }, engines: NODES.map((n) => ({ ...n })) });
  const fronts = new Map<string, MetricsFront>();
  for (const n of NODES) fronts.set(n.id, await startMetricsFront(cluster.engines.get(n.id).url));
  const control = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const [, kind, id, what] = (req.url ?? "").split("/");
      const front = kind === "fronts" ? fronts.get(id ?? "") : undefined;
      const reply = (status: number, body: unknown) => {
        res.writeHead(status, { "content-type": "application/json" });
        res.end(JSON.stringify(body));
      };
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
  project.provide("signals", {
    controlUrl: `http://127.0.0.1:${(control.address() as AddressInfo).port}`,
    simControlUrl: cluster.controlUrl,
    nodes: Object.fromEntries([...fronts].map(([id, f]) => [id, f.url])),
  });
  return async () => {
    control.closeAllConnections();
    await new Promise<void>((resolve) => control.close(() => resolve()));
    await Promise.all([...fronts.values()].map((f) => f.close()));
    await cluster.close();
  };
}
