import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { chromium, type Browser } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
// @ts-expect-error plain JS module of the simulator
import { startSimCluster } from "../../sim/cluster.mjs";
// @ts-expect-error plain JS module
import { startRouter } from "../../scripts/router-process.mjs";
import { freePort } from "../support/free-port";

// A pool cut into cells (docs/scaling.md, "Cells"): the status page shows which cell's object
// routes each node, as an operator needs to read a cell's load. Without cells the column is not
// there (test/e2e/status-page.test.ts reads the first columns of the same table).

const ADMIN_TOKEN = "e2e-cells-admin-token";
const CHROMIUM = process.env.CHROMIUM_PATH ?? "/usr/bin/chromium";

describe("status page with cells", () => {
  let cluster: any;
  let router: { url: string; stop: () => Promise<void> };
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
    persistDir = await mkdtemp(path.join(tmpdir(), "pd-router-e2e-cells-"));
    router = await startRouter({
      port: await freePort(),
      inspectorPort: await freePort(),
      persistDir,
      vars: { ADMIN_TOKEN, CONFIG_TTL_MS: 0 },
      clusterDocument: {
        protocol: "vllm",
        policy: { prefill: "affinity", decode: "affinity" },
        // two cells; a group stays whole in one cell
        cells: 2,
        nodes: [
          { id: "p0", url: url("p0"), role: "prefill", group: "rack-a" },
          { id: "p1", url: url("p1"), role: "prefill", group: "rack-b" },
          { id: "d0", url: url("d0"), role: "decode", group: "rack-a" },
          { id: "d1", url: url("d1"), role: "decode", group: "rack-b" },
        ],
      },
    });
    browser = await chromium.launch({ executablePath: CHROMIUM, args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"] });
  });

  afterAll(async () => {
    await browser?.close();
    await router?.stop();
    await cluster?.close();
    if (persistDir) await rm(persistDir, { recursive: true, force: true });
  });

  it("shows each node's cell, one per group, beside its group", async () => {
    const res = await fetch(`${router.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-session-id": "cells-e2e" },
      body: JSON.stringify({ model: "sim-model", messages: [{ role: "user", content: "hello" }], max_tokens: 2 }),
    });
    expect(res.status, await res.text()).toBe(200);
    const page = await browser.newPage();
    const consoleErrors: string[] = [];
    page.on("console", (m) => m.type() === "error" && consoleErrors.push(m.text()));
    await page.goto(`${router.url}/status#token=${ADMIN_TOKEN}`);
    await page.locator('tr[data-node="d1"] td.cell').waitFor();
    expect(await page.locator("#cell-head").isVisible()).toBe(true);
    const rows = await page.locator("#nodes tr").evaluateAll((trs) => trs.map((tr) => [...tr.children].map((td) => td.textContent)));
    const cellOf = Object.fromEntries(rows.map((r) => [r[0], r[3]]));
    expect(Object.values(cellOf).every((c) => /cell:[01]$/.test(c ?? ""))).toBe(true);
    // a group's nodes in one cell, the two groups in two
    expect(cellOf.p0).toBe(cellOf.d0);
    expect(cellOf.p1).toBe(cellOf.d1);
    expect(cellOf.p0).not.toBe(cellOf.p1);
    // the health column still follows
    expect(rows.map((r) => r[4])).toEqual(["up", "up", "up", "up"]);
    expect(consoleErrors).toEqual([]);
  });
});
