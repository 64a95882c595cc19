// Issue 18 item 4: SGLang engines started with --api-key. Their middleware lets only /health*,
// /ready* and /metrics* through without the key (sgl-project/sglang
// python/sglang/srt/utils/auth.py `decide_request_auth`), and the sglang protocol probes
// /v1/models (a cheap path; /health runs a generation). An unauthenticated probe would mark
// every such node down; the router probes with the node's own token. The fake engine below
// applies that middleware; the simulator has no --api-key mode.
import type http from "node:http";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { admin, json, serve, startDeployRig, until, type DeployRig } from "./deploy-rig";

const KEY = "sglang-api-key";

/** An SGLang HTTP server with --api-key: what its auth middleware lets through, and a /v1/models. */
function sglangWithApiKey(seen: Array<{ path: string; auth: string | undefined }>) {
  return (req: http.IncomingMessage, res: http.ServerResponse) => {
    const path = new URL(req.url ?? "/", "http://x").pathname;
    seen.push({ path, auth: req.headers.authorization });
    const open = path.startsWith("/health") || path.startsWith("/ready") || path.startsWith("/metrics");
    if (!open && req.headers.authorization !== `Bearer ${KEY}`) return json(res, 401, { error: "Unauthorized" });
    if (path === "/v1/models") return json(res, 200, { object: "list", data: [{ id: "sim-model", object: "model" }] });
    json(res, 200, {});
  };
}

let rig: DeployRig;
const seen = { keyed: [] as Array<{ path: string; auth: string | undefined }>, bare: [] as Array<{ path: string; auth: string | undefined }> };
const servers: Array<{ url: string; close: () => Promise<void> }> = [];

beforeAll(async () => {
  const keyed = await serve(sglangWithApiKey(seen.keyed));
  const bare = await serve(sglangWithApiKey(seen.bare));
  servers.push(keyed, bare);
  rig = await startDeployRig({ vars: { NODE_SGLANG_KEY: KEY } });
  await rig.putDocument({
    protocol: "sglang",
    health: { intervalMs: 1000, downAfter: 1, upAfter: 1 },
    nodes: [
      // the same engine setup; only one node names the key's secret
      { id: "p-keyed", url: keyed.url, role: "prefill", apiKeySecret: "NODE_SGLANG_KEY" },
      { id: "d-bare", url: bare.url, role: "decode" },
    ],
  });
}, 60_000);

afterAll(async () => {
  await rig?.stop();
  await Promise.all(servers.map((s) => s.close()));
});

const status = async () => (await (await rig.fetch("/admin/status", { headers: admin })).json()) as any;

describe("4. SGLang probes with --api-key: the probe carries the node's token", () => {
  it("a node whose apiKeySecret holds the key stays up on /v1/models probes; one without it is (rightly) down", async () => {
    // /admin/status hands the object the document, which arms its probe alarm
    const s = await until("both nodes probed", status, () => seen.keyed.length >= 2 && seen.bare.length >= 1, 8000);
    expect(s.nodes.length).toBe(2);
    const probes = seen.keyed.filter((r) => r.path === "/v1/models");
    expect(probes.length).toBeGreaterThanOrEqual(1);
    for (const p of probes) expect(p.auth).toBe(`Bearer ${KEY}`);
    const after = await until("probe verdicts", status, (v) => v.nodes.find((n: any) => n.id === "d-bare").probeUp === false, 5000);
    expect(after.nodes.find((n: any) => n.id === "p-keyed").probeUp).toBe(true);
    // the node without a secret is probed without one: its middleware answers 401
    expect(seen.bare.every((r) => r.auth === undefined)).toBe(true);
  });
});
