import { readFile, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
// @ts-expect-error plain JavaScript module without type declarations
import { startRouter } from "../../scripts/router-process.mjs";

// The status page is a static asset (assets/status.html), outside the Worker's code, so that a
// cold start does not load it. What an operator deploys is wrangler.toml as it is: this runs
// the Worker under `wrangler dev`, which serves assets as Cloudflare does, and checks that the
// Worker still runs first for every path: the page's own file is never served as it lies.
// (In the e2e suite, not npm test: starting wrangler dev takes seconds.)

const ROOT = path.resolve(import.meta.dirname, "../..");
const ADMIN_TOKEN = "assets-admin-token";

describe("the status page as a static asset, under wrangler dev", () => {
  let router: { url: string; stop: () => Promise<void> };
  let persistDir: string;

  beforeAll(async () => {
    persistDir = await mkdtemp(path.join(tmpdir(), "pd-router-assets-"));
    router = await startRouter({
      // wrangler binds free ports itself (one picked beforehand can be taken while it starts)
      port: 0,
      inspectorPort: 0,
      persistDir,
      vars: { ADMIN_TOKEN, CONFIG_TTL_MS: 0 },
      // no engine is needed: nothing here is routed
      clusterDocument: { protocol: "colocated", nodes: [{ id: "n0", url: "http://127.0.0.1:9", role: "both" }] },
    });
  }, 120_000);

  afterAll(async () => {
    await router?.stop();
    if (persistDir) await rm(persistDir, { recursive: true, force: true });
  });

  it("GET /status is the asset's page, with the CSP hash of its inline script", async () => {
    const res = await fetch(`${router.url}/status`);
    expect(res.status).toBe(200);
    const html = await res.text();
    expect(html).toBe(await readFile(path.join(ROOT, "assets/status.html"), "utf8"));
    const script = /<script>([\s\S]*)<\/script>/.exec(html)![1]!;
    const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(script));
    expect(res.headers.get("content-security-policy")).toContain(`'sha256-${Buffer.from(digest).toString("base64")}'`);
  });

  it("the Worker still decides who gets the page", async () => {
    expect((await fetch(`${router.url}/status`, { headers: { authorization: "Bearer wrong" } })).status).toBe(401);
  });

  it("the asset's own path is an unknown route: the Worker runs first for every path", async () => {
    const res = await fetch(`${router.url}/status.html`);
    expect(res.status).toBe(404);
    expect(((await res.json()) as any).error.code).toBe("unknown_route");
  });
});
