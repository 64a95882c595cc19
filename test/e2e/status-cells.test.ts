import type { Browser } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { fourNodes, launchChromium, startFourEngines, startTestRouter, type TestRouter } from "./status-stack";

// A pool cut into cells (docs/scaling.md, "Cells"): the status page shows which cell's object
// routes each node, as an operator needs to read a cell's load. Without cells the column is not
// there (test/e2e/status-page.test.ts reads the first columns of the same table).

const ADMIN_TOKEN = "e2e-cells-admin-token";

describe("status page with cells", () => {
  let cluster: any;
  let router: TestRouter;
  let browser: Browser;

  beforeAll(async () => {
    cluster = await startFourEngines();
    const url = (id: string) => cluster.engines.get(id).url as string;
    router = await startTestRouter(ADMIN_TOKEN, {
      protocol: "vllm",
      policy: { prefill: "affinity", decode: "affinity" },
      // two cells; a group stays whole in one cell
      cells: 2,
      nodes: fourNodes(url),
    });
    browser = await launchChromium();
  });

  afterAll(async () => {
    await browser?.close();
    await router?.stop();
    await cluster?.close();
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
    const cellOf: Record<string, string> = Object.fromEntries(rows.map((r) => [r[0] ?? "", r[3] ?? ""]));
    expect(Object.values(cellOf).every((c) => /cell:[01]$/.test(c))).toBe(true);
    // a group's nodes in one cell, the two groups in two
    expect(cellOf.p0).toBe(cellOf.d0);
    expect(cellOf.p1).toBe(cellOf.d1);
    expect(cellOf.p0).not.toBe(cellOf.p1);
    // the health column still follows
    expect(rows.map((r) => r[4])).toEqual(["up", "up", "up", "up"]);
    expect(consoleErrors).toEqual([]);
  });
});
