import type { TestProject } from "vitest/node";
// @ts-expect-error plain JS module of the simulator
import { startSimCluster } from "../sim/cluster.mjs";

// Real engines on 127.0.0.1 for the Worker suite: the Worker in workerd reaches them over
// HTTP, and tests steer them (faults, stop/start, request logs) through the control server.
export default async function setup(project: TestProject) {
  const cluster = await startSimCluster({
    defaults: { timeScale: 0.01 },
    engines: [
      // SGLang bootstrap ports: p0 the document default, p1 a custom one
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
    ],
  });
  const engines: Record<string, string> = {};
  for (const [id, engine] of cluster.engines as Map<string, { url: string }>) engines[id] = engine.url;
  project.provide("sim", { controlUrl: cluster.controlUrl, engines });
  return async () => {
    await cluster.close();
  };
}
