import http from "node:http";
import type { AddressInfo } from "node:net";
import type { TestProject } from "vitest/node";
// @ts-expect-error plain JS module of the simulator
import { startSimCluster } from "../sim/cluster.mjs";

/**
 * The simulated engines every Worker test file gets. The Worker in workerd reaches them over
 * HTTP, and tests steer them (faults, stop/start, request logs) through the cluster's control server.
 */
export const FILE_ENGINES = [
  // SGLang bootstrap ports: p0 the document default, p1 a custom one (numbers the engine answers to, not ports it binds)
  { id: "p0", role: "prefill", bootstrapPort: 8998 },
  { id: "p1", role: "prefill", bootstrapPort: 9123 },
  { id: "p2", role: "prefill" },
  { id: "d0", role: "decode" },
  { id: "d1", role: "decode" },
  { id: "d2", role: "decode" },
  { id: "c0", role: "both" },
  { id: "c1", role: "both" },
  // slow decoding (15 ms a token) for streaming and abort tests
  { id: "slow", role: "decode", timeScale: 1 },
  // a prefill node that takes real time (0.05 ms a token: an 8k-token prompt ~0.4 s), for
  // long prompts on a busy P (SGLang, Mooncake, duplicate ids); its bootstrap port is its HTTP port
  { id: "pslow", role: "prefill", timeScale: 1 },
  // a second, independent node pool: another model (its own ClusterState object)
  { id: "pa", role: "prefill", models: ["pool-a-model"] },
  { id: "da", role: "decode", models: ["pool-a-model"] },
];

type SimCluster = { engines: Map<string, { url: string }>; controlUrl: string; close(): Promise<void> };

/**
 * One set of engines per test file, not one for the whole run: vitest runs files in parallel
 * (one worker per core but one), and a shared cluster lets one file's reset clear the faults
 * another file just set, and one file's traffic show up in another's request logs. Each file
 * asks this factory for its own cluster before its tests (test/worker/file-engines.ts) and
 * closes it after; starting twelve engines takes a few milliseconds.
 */
export default async function setup(project: TestProject) {
  const clusters = new Map<string, SimCluster>();
  let next = 0;
  const server = http.createServer((req, res) => {
    const reply = (status: number, body: unknown) => {
      res.writeHead(status, { "content-type": "application/json" });
      res.end(JSON.stringify(body));
    };
    req.resume();
    req.on("end", () => {
      const id = /^\/clusters\/([^/]+)$/.exec(req.url ?? "")?.[1];
      if (req.method === "POST" && req.url === "/clusters") {
        startSimCluster({ defaults: { timeScale: 0.01 }, engines: FILE_ENGINES }).then(
          (cluster: SimCluster) => {
            const key = String(++next);
            clusters.set(key, cluster);
            const engines: Record<string, string> = {};
            for (const [engine, e] of cluster.engines) engines[engine] = e.url;
            reply(200, { id: key, controlUrl: cluster.controlUrl, engines });
          },
          (err: unknown) => reply(500, { error: String(err) }),
        );
      } else if (req.method === "DELETE" && id !== undefined) {
        const cluster = clusters.get(id);
        clusters.delete(id);
        void (cluster?.close() ?? Promise.resolve()).then(() => reply(200, { ok: true }));
      } else reply(404, { error: `no route ${req.method} ${req.url}` });
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  project.provide("simFactory", `http://127.0.0.1:${(server.address() as AddressInfo).port}`);
  return async () => {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
    await Promise.all([...clusters.values()].map((c) => c.close()));
  };
}
