import { env, SELF } from "cloudflare:test";
import { describe, expect, it } from "vitest";
import { parseClusterDocument, type ClusterConfig } from "../../src/config/schema";
import { listModels } from "../../src/routes/models";
import { waitFor } from "./engines-helpers";
import { control, engineUrl, putCluster } from "./helpers";

const models = async () => ((await (await SELF.fetch("http://router/v1/models")).json()) as any).data.map((m: any) => m.id);

function config(doc: unknown): ClusterConfig {
  const parsed = parseClusterDocument(doc);
  if (!parsed.ok) throw new Error(JSON.stringify(parsed.problems));
  return parsed.config;
}

describe("GET /v1/models does not fan out to every node on every call", () => {
  it("reuses the union per document version for a while (a node that went away is not asked again)", async () => {
    // c1 is used by no other forwarding test: stopping it briefly disturbs nobody
    await putCluster({
      protocol: "colocated",
      nodes: [
        { id: "c1", role: "both" },
        { id: "c0", role: "both", models: ["listed"] },
      ],
    });
    // c1 answers within the fan-out's 2 s timeout, or (a machine starved of CPU) a later call asks
    // again once the partial union's short cache runs out
    await waitFor(models, (m) => m.length === 2, 20000, "c1's models listed");
    expect(await models()).toEqual(["listed", "sim-model"]);
    await control("/engines/c1/stop", {});
    try {
      // today every call asks c1 again, and a stopped c1 lists nothing
      expect(await models()).toEqual(["listed", "sim-model"]);
    } finally {
      await control("/engines/c1/start", {});
    }
    // a new document version asks again
    await putCluster({
      protocol: "colocated",
      nodes: [
        { id: "c1", role: "both" },
        { id: "c0", role: "both", models: ["other"] },
      ],
    });
    expect(await waitFor(models, (m) => m.length === 2, 20000, "c1's models listed")).toEqual(["other", "sim-model"]);
  });
});

describe("listModels: how nodes are asked", () => {
  const seen: Array<{ url: string; auth: string | null; redirect: string | undefined }> = [];
  const fakeFetch = (answer: (url: string) => Response) =>
    (async (input: RequestInfo | URL, init?: RequestInit) => {
      const url = String(input);
      seen.push({ url, auth: new Headers(init?.headers).get("authorization"), redirect: init?.redirect });
      return answer(url);
    }) as typeof fetch;

  it("sends the node's bearer token (apiKeySecret) and follows no redirect", async () => {
    seen.length = 0;
    const cfg = config({
      protocol: "colocated",
      nodes: [
        { id: "a", url: "http://10.0.0.1:8000", role: "both", apiKeySecret: "NODE_TOKEN_P0" },
        { id: "b", url: "http://10.0.0.2:8000", role: "both" },
      ],
    });
    const names = await listModels(cfg, {
      env: env as unknown as Record<string, unknown>,
      fetch: fakeFetch(() => Response.json({ data: [{ id: "m1" }] })),
    });
    expect(names).toEqual(["m1"]);
    expect(seen).toEqual([
      { url: "http://10.0.0.1:8000/v1/models", auth: "Bearer node-secret-p0", redirect: "manual" },
      { url: "http://10.0.0.2:8000/v1/models", auth: null, redirect: "manual" },
    ]);
  });

  it("treats a redirect as a node that lists nothing", async () => {
    const cfg = config({ protocol: "colocated", nodes: [{ id: "a", url: engineUrl("c0"), role: "both" }] });
    const names = await listModels(cfg, { fetch: fakeFetch(() => new Response(null, { status: 307, headers: { location: "http://evil.example/v1/models" } })) });
    expect(names).toEqual([]);
  });

  it("asks again after the cache time, sooner when a node did not answer", async () => {
    seen.length = 0;
    let t = 0;
    const cfg = config({ protocol: "colocated", nodes: [{ id: "a", url: "http://10.0.0.1:8000", role: "both" }] });
    const ok = fakeFetch(() => Response.json({ data: [{ id: "m1" }] }));
    await listModels(cfg, { fetch: ok, now: () => t });
    t = 29_000;
    await listModels(cfg, { fetch: ok, now: () => t });
    expect(seen).toHaveLength(1);
    t = 30_001;
    await listModels(cfg, { fetch: ok, now: () => t });
    expect(seen).toHaveLength(2);
  });
});
