// Drives one ClusterState object as the router's requests do, to measure how many routed
// requests a second a single object sustains (docs/scaling.md). Built with scripts/workerd-router.mjs
// (--entry) against the same src/ as the router; the Durable Object is the real one.
//
//   GET /drive?nodes=64&policy=round_robin&op=request&requests=64&parallel=16
//     runs `requests` requests through the object, `parallel` at a time, and answers
//     { requests, calls, ms, requestMs: [...] } (each request's calls, as the Worker saw them).
import { clusterView } from "../../src/config/runtime";
import { parseClusterDocument } from "../../src/config/schema";
import type { Env } from "../../src/env";
import { ClusterState } from "../../src/state/cluster-state";
import type { ClusterView } from "../../src/state/types";

export { ClusterState };

/** One request's calls to the object; keep in step with src/routes/routed-request.ts (the hot path). */
const OPS = {
  /** the cheapest RPC the object has: what any call costs before it does work */
  noop: async (stub: Stub) => {
    await stub.countKey("bench");
    return 1;
  },
  /** pick + lease, then release */
  route_finish: async (stub: Stub, r: RequestShape) => {
    const routed = await stub.route(r.route);
    if (!routed.ok) throw new Error(`route failed: ${JSON.stringify(routed.error)}`);
    await stub.finish(r.route.leaseId ?? null, finishReport(routed.decision.prefill.id, routed.decision.decode.id));
    return 2;
  },
  /** what a vllm request does today: route, prefillDone, finish */
  request: async (stub: Stub, r: RequestShape) => {
    const routed = await stub.route(r.route);
    if (!routed.ok) throw new Error(`route failed: ${JSON.stringify(routed.error)}`);
    const p = routed.decision.prefill.id;
    await stub.prefillDone(r.route.leaseId!, { node: p, outcome: "ok", ms: 5 });
    await stub.finish(r.route.leaseId!, finishReport(p, routed.decision.decode.id));
    return 3;
  },
} as const;

type Stub = DurableObjectStub<ClusterState>;
type RequestShape = { route: Parameters<ClusterState["route"]>[0] };

function finishReport(p: string, d: string) {
  return { route: "/v1/chat/completions", status: 200, prefill: { node: p, outcome: "ok" as const, ms: 5 }, decode: { node: d, outcome: "ok" as const, ms: 10 } };
}

const views = new Map<string, ClusterView>();

/** A cluster of `nodes` nodes, half P and half D, as the router would send it. */
function viewFor(nodes: number, policy: string): ClusterView {
  const name = `${nodes}/${policy}`;
  let view = views.get(name);
  if (!view) {
    const half = Math.max(1, nodes >> 1);
    const doc = {
      protocol: "vllm",
      policy: { prefill: policy, decode: policy },
      nodes: Array.from({ length: nodes }, (_, i) => ({
        id: `${i < half ? "p" : "d"}${i}`,
        url: `http://10.0.${i >> 8}.${i & 255}:8000`,
        role: i < half ? "prefill" : "decode",
      })),
    };
    const parsed = parseClusterDocument(JSON.stringify(doc));
    if (!parsed.ok) throw new Error(JSON.stringify(parsed.problems));
    view = clusterView(parsed.config, `bench-${name}`);
    views.set(name, view);
  }
  return view;
}

const hex = (n: number, width = 64) => n.toString(16).padStart(width, "0");

/** cache_aware: a 30k-token prompt is 58 blocks of 2,048 characters; 256 conversations of them. */
function prefixHashes(conversation: number, blocks: number): string[] {
  return Array.from({ length: blocks }, (_, j) => hex(conversation * 1_000 + j));
}

let seq = 0;

export default {
  async fetch(request: Request, env: Env): Promise<Response> {
    const u = new URL(request.url);
    if (u.pathname === "/healthz") return new Response("ok");
    if (u.pathname !== "/drive") return new Response("not found", { status: 404 });
    const q = (name: string, fallback: number) => Number(u.searchParams.get(name) ?? fallback);
    const nodes = q("nodes", 8);
    const policy = u.searchParams.get("policy") ?? "round_robin";
    const opName = (u.searchParams.get("op") ?? "request") as keyof typeof OPS;
    const op = OPS[opName];
    if (!op) return new Response(`unknown op ${opName}`, { status: 400 });
    const requests = q("requests", 64);
    const parallel = q("parallel", 16);
    const blocks = q("blocks", 58);
    const view = viewFor(nodes, policy);
    // one object per cluster size and policy, as one router deployment would have
    const stub = env.CLUSTER_STATE.get(env.CLUSTER_STATE.idFromName(`capacity/${nodes}/${policy}`)) as Stub;
    const keyed = policy !== "round_robin";
    // The router sends the document once (the object asks for it by answering stale_view), then its version.
    await stub.route({ version: view.version, cluster: view, model: "sim-model", key: null, prefixHashes: [], tokens: 0, dryRun: true });
    let next = 0;
    let calls = 0;
    const requestMs: number[] = [];
    const started = Date.now();
    await Promise.all(
      Array.from({ length: Math.min(parallel, requests) }, async () => {
        while (next < requests) {
          next++;
          const i = seq++;
          const conversation = i % 256;
          const route = {
            version: view.version,
            model: "sim-model",
            key: keyed ? hex(conversation) : null,
            prefixHashes: policy === "cache_aware" ? prefixHashes(conversation, blocks) : [],
            tokens: 8_000,
            dryRun: false,
            leaseId: `bench-${i}`,
          };
          const t = Date.now();
          const n = await op(stub, { route });
          calls += n;
          requestMs.push(Date.now() - t);
        }
      }),
    );
    return Response.json({ requests, calls, ms: Date.now() - started, requestMs });
  },
} satisfies ExportedHandler<Env>;
