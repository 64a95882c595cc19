import { mkdtemp, rm } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { chromium, type Browser } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
// @ts-expect-error plain JS module of the simulator
import { startSimCluster } from "../../sim/cluster.mjs";
// @ts-expect-error plain JS module
import { startRouter } from "../../scripts/router-process.mjs";

const ADMIN_TOKEN = "e2e-admin-token";
const CHROMIUM = process.env.CHROMIUM_PATH ?? "/usr/bin/chromium";

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as { port: number };
      server.close(() => resolve(port));
    });
  });
}

describe("status page in a browser", () => {
  let cluster: any;
  let router: { url: string; stop: () => Promise<void>; output: () => string };
  let browser: Browser;
  let persistDir: string;

  beforeAll(async () => {
    cluster = await startSimCluster({
      defaults: { timeScale: 0.01 },
      engines: [
        { id: "p0", role: "prefill" },
        { id: "p1", role: "prefill" },
        { id: "d0", role: "decode" },
        { id: "d1", role: "decode" },
      ],
    });
    const url = (id: string) => cluster.engines.get(id).url as string;
    persistDir = await mkdtemp(path.join(tmpdir(), "pd-router-e2e-"));
    router = await startRouter({
      port: await freePort(),
      inspectorPort: await freePort(),
      persistDir,
      vars: { ADMIN_TOKEN, CONFIG_TTL_MS: 0 },
      clusterDocument: {
        protocol: "vllm",
        policy: { prefill: "round_robin", decode: "round_robin" },
        // probe every 250 ms, one failed probe marks a node down
        health: { intervalMs: 250, probeTimeoutMs: 500, downAfter: 1, upAfter: 1 },
        nodes: [
          { id: "p0", url: url("p0"), role: "prefill", group: "rack-a" },
          { id: "p1", url: url("p1"), role: "prefill", group: "rack-b" },
          { id: "d0", url: url("d0"), role: "decode", group: "rack-a" },
          { id: "d1", url: url("d1"), role: "decode", group: "rack-b" },
        ],
      },
    });
    browser = await chromium.launch({
      executablePath: CHROMIUM,
      args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"],
    });
  });

  afterAll(async () => {
    await browser?.close();
    await router?.stop();
    await cluster?.close();
    if (persistDir) await rm(persistDir, { recursive: true, force: true });
  });

  it("logs in, shows the nodes and the routing mix, and shows a stopped engine as down", async () => {
    // some routed traffic, so the routing mix has rows
    for (let i = 0; i < 4; i++) {
      const res = await fetch(`${router.url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: "sim-model", messages: [{ role: "user", content: `hello ${i}` }], max_tokens: 2 }),
      });
      expect(res.status, await res.text()).toBe(200);
    }

    const page = await browser.newPage();
    const consoleErrors: string[] = [];
    page.on("console", (m) => m.type() === "error" && consoleErrors.push(m.text()));
    await page.goto(`${router.url}/status`);
    await page.locator("#login-form").waitFor();
    await page.fill("#token", "wrong-token");
    await page.click("#login-form button");
    await page.locator("#login-message", { hasText: "not accepted" }).waitFor();

    await page.fill("#token", ADMIN_TOKEN);
    await page.click("#login-form button");
    await page.locator('tr[data-node="d1"]').waitFor();
    const rows = await page.locator("#nodes tr").evaluateAll((trs) => trs.map((tr) => [...tr.children].map((td) => td.textContent)));
    expect(rows.map((r) => r.slice(0, 4))).toEqual([
      ["p0", "prefill", "rack-a", "up"],
      ["p1", "prefill", "rack-b", "up"],
      ["d0", "decode", "rack-a", "up"],
      ["d1", "decode", "rack-b", "up"],
    ]);
    const mix = await page.locator("#mix").textContent();
    expect(mix).toContain("round_robin");
    // the token lives in this tab's session storage, never in the URL
    expect(page.url()).not.toContain(ADMIN_TOKEN);

    const stop = await fetch(`${cluster.controlUrl}/engines/d1/stop`, { method: "POST", body: "{}" });
    expect(stop.status).toBe(200);
    await page.locator('tr[data-node="d1"][data-health="down"]').waitFor({ timeout: 15000 });
    expect(await page.locator('tr[data-node="d1"] td.health').textContent()).toBe("down");
    expect(await page.locator('tr[data-node="d0"]').getAttribute("data-health")).toBe("up");

    // it keeps refreshing: the engine comes back and so does the row
    await fetch(`${cluster.controlUrl}/engines/d1/start`, { method: "POST", body: "{}" });
    await page.locator('tr[data-node="d1"][data-health="up"]').waitFor({ timeout: 15000 });
    expect(consoleErrors.filter((e) => !/401/.test(e))).toEqual([]);
  });
});
