import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import type { Browser, Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startMetricsFront, type MetricsFront } from "../support/metrics-front";
import { fourNodes, launchChromium, startFourEngines, startTestRouter, type TestRouter } from "./status-stack";

const ADMIN_TOKEN = "e2e-admin-token";

describe("status page in a browser", () => {
  let cluster: any;
  let router: TestRouter;
  let browser: Browser;
  // the decode nodes answer GET /metrics like vLLM (KV use 40% and 70%); everything else reaches the engines
  const fronts: Record<string, MetricsFront> = {};

  beforeAll(async () => {
    cluster = await startFourEngines();
    const engineUrl = (id: string) => cluster.engines.get(id).url as string;
    for (const [id, kvUsage] of [
      ["d0", 0.4],
      ["d1", 0.7],
    ] as const) {
      fronts[id] = await startMetricsFront(engineUrl(id));
      fronts[id].set({ mode: "override", values: { kvUsage, waiting: 0, running: 2 } });
    }
    const url = (id: string) => fronts[id]?.url ?? engineUrl(id);
    router = await startTestRouter(ADMIN_TOKEN, {
      protocol: "vllm",
      policy: { prefill: "round_robin", decode: "round_robin" },
      // probe every second (the shortest interval allowed), one failed probe marks a node down
      health: { intervalMs: 1000, probeTimeoutMs: 500, downAfter: 1, upAfter: 1 },
      // sharded polling forced on (docs/scaling.md): two SignalPoller objects poll the four
      // nodes' /metrics and push the readings, so the KV chart below is drawn from them
      signals: { intervalMs: 1000, staleMs: 5000, shardAbove: 3, nodesPerPoller: 2 },
      nodes: fourNodes(url),
    });
    browser = await launchChromium();
  });

  afterAll(async () => {
    await browser?.close();
    await router?.stop();
    await Promise.all(Object.values(fronts).map((f) => f.close()));
    await cluster?.close();
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
    // where the requests were prefilled (x-pd-mode and reason): all four disaggregated, as the document says
    const modes = await page.locator("#modes tr").evaluateAll((trs) => trs.map((tr) => [...tr.children].map((td) => td.textContent)));
    expect(modes.map((r) => r.slice(0, 2))).toEqual([["disaggregated", "always"]]);
    expect(Number(modes[0]![2])).toBeGreaterThanOrEqual(4);
    // the poller objects, each with its nodes and how long since it pushed readings
    await page.locator("#pollers", { hasText: "poller 1" }).waitFor();
    const pollers = (await page.locator("#pollers").textContent()) ?? "";
    expect(pollers).toMatch(/^Signal pollers \(sharded \/metrics polling\): poller 0: \d nodes, last push [\d.]+ s ago; poller 1: \d nodes, last push [\d.]+ s ago$/);
    expect([...pollers.matchAll(/(\d) nodes/g)].reduce((n, m) => n + Number(m[1]), 0)).toBe(4);
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

  it("draws charts of the last minutes that move with traffic and mark failures and ejections", async () => {
    const shots = await mkdtemp(path.join(tmpdir(), "pd-router-status-shots-"));
    const shot = async (page: Page, name: string) => {
      const file = path.join(shots, name);
      await page.screenshot({ path: file, fullPage: true });
      console.info(`screenshot: ${file}`);
    };
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    const consoleErrors: string[] = [];
    page.on("console", (m) => m.type() === "error" && consoleErrors.push(m.text()));
    // the link `npm start` prints: the token rides in the fragment, which never reaches the server
    await page.goto(`${router.url}/status#token=${ADMIN_TOKEN}`);
    // (a flat line has an empty bounding box, which Playwright calls hidden: wait for it to exist)
    await page.locator('svg[data-chart="rps"] polyline[data-series="p0"]').waitFor({ state: "attached" });
    expect(page.url()).not.toContain(ADMIN_TOKEN);
    expect(await page.evaluate(() => sessionStorage.getItem("pd-router-admin-token"))).toBe(ADMIN_TOKEN);

    /** the numbers a chart's polyline plots (data-values), and its SVG points */
    const line = (chart: string, series: string) =>
      page
        .locator(`svg[data-chart="${chart}"] polyline[data-series="${series}"]`)
        .evaluate((el) => ({ values: JSON.parse(el.getAttribute("data-values") ?? "[]") as number[], points: el.getAttribute("points") ?? "" }));
    /** wait until a polyline plots at least minLength values, some above `some`, all above `every` */
    const waitValues = (chart: string, series: string, want: { minLength?: number; some?: number; every?: number }, timeout = 20000) =>
      page.waitForFunction(
        ({ chart, series, want }) => {
          const el = document.querySelector(`svg[data-chart="${chart}"] polyline[data-series="${series}"]`);
          const v: number[] = JSON.parse(el?.getAttribute("data-values") ?? "[]");
          return v.length >= (want.minLength ?? 1) && (want.some === undefined || v.some((x) => x > want.some!)) && (want.every === undefined || v.every((x) => x > want.every!));
        },
        { chart, series, want },
        { timeout, polling: 250 },
      );

    // idle: a few polls, every series plotted at 0 requests/s
    await waitValues("rps", "routed (router)", { minLength: 2 });
    const idle = await line("rps", "routed (router)");
    expect(Math.max(...idle.values)).toBe(0);
    for (const chart of ["rps", "inflight", "ttfb", "events"]) expect(await page.locator(`svg[data-chart="${chart}"]`).count()).toBe(1);
    expect(await page.locator("#chart-rps .legend .key").allTextContents()).toEqual(
      expect.arrayContaining([expect.stringMatching(/^p0/), expect.stringMatching(/^d1/), expect.stringMatching(/^routed/)]),
    );
    // the prefix hit ratio is a cache_aware figure: round_robin says so instead of an empty chart
    expect(await page.locator("#chart-hit").isHidden()).toBe(true);
    expect(await page.locator("#hit-off").textContent()).toContain("round_robin");
    await shot(page, "1-idle.png");

    // traffic: 6 clients for 5 s; the requests/s line rises and the TTFB percentiles appear
    const chat = (content: string, extra: object = {}) =>
      fetch(`${router.url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: "sim-model", messages: [{ role: "user", content }], max_tokens: 4, ...extra }),
      }).then((r) => r.arrayBuffer().then(() => r.status));
    const until = Date.now() + 5000;
    const load = Promise.all(
      Array.from({ length: 6 }, async (_, k) => {
        for (let i = 0; Date.now() < until; i++) await chat(`client ${k} turn ${i}`, { stream: i % 2 === 0 });
      }),
    );
    await waitValues("rps", "routed (router)", { some: 1 });
    await waitValues("rps", "d0", { some: 0 });
    await load;
    await waitValues("ttfb", "p50", { every: 0 });
    const busy = await line("rps", "routed (router)");
    expect(busy.points).not.toBe(idle.points);
    expect(Math.max(...busy.values)).toBeGreaterThan(1);
    const p50 = (await line("ttfb", "p50")).values;
    const p99 = (await line("ttfb", "p99")).values;
    expect(p99.at(-1)!).toBeGreaterThanOrEqual(p50.at(-1)!);
    expect(await page.locator("#chart-ttfb .legend").textContent()).toMatch(/p50[\d.]+ ms/);
    await shot(page, "2-traffic.png");

    // d1 answers 500 three times in a row: failures marked, then its ejection (ejectAfter 3)
    const fault = await fetch(`${cluster.controlUrl}/engines/d1/fault`, { method: "POST", body: JSON.stringify({ mode: "status500", count: 3 }) });
    expect(fault.status).toBe(200);
    for (let i = 0; i < 8; i++) await chat(`eject ${i}`);
    await page.locator('svg[data-chart="events"] [data-kind="eject"][data-node="d1"]').waitFor({ state: "attached", timeout: 15000 });
    expect(await page.locator('svg[data-chart="events"] [data-kind="failure"][data-node="d1"]').count()).toBeGreaterThan(0);
    expect(await page.locator('svg[data-chart="events"] [data-kind="failure"][data-node="d0"]').count()).toBe(0);
    await page.locator('svg[data-chart="events"] rect[data-band="ejected"][data-node="d1"]').waitFor({ state: "attached" });
    // the ejection is drawn across the time charts too, and the node table agrees
    expect(await page.locator('svg[data-chart="rps"] line[data-eject="d1"]').count()).toBe(1);
    expect(await page.locator('tr[data-node="d1"]').getAttribute("data-health")).toBe("ejected");
    await shot(page, "3-ejected.png");

    // under cache_aware the prefix hit ratio chart appears and plots the repeated prefixes
    const doc = await (await fetch(`${router.url}/admin/nodes`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } })).json();
    const put = await fetch(`${router.url}/admin/nodes`, {
      method: "PUT",
      headers: { authorization: `Bearer ${ADMIN_TOKEN}`, "content-type": "application/json" },
      body: JSON.stringify({ ...doc, policy: { prefill: "cache_aware", decode: "cache_aware" } }),
    });
    expect(put.status, await put.clone().text()).toBe(200);
    await page.locator("#chart-hit").waitFor({ state: "visible", timeout: 10000 });
    const shared = "You are a careful assistant. ".repeat(200); // several 2048-character prefix blocks
    for (let turn = 0; turn < 4; turn++) await Promise.all([0, 1, 2].map((k) => chat(`${shared} conversation ${k}`)));
    await waitValues("hit", "matched / looked-up blocks", { some: 0 });
    const hit = (await line("hit", "matched / looked-up blocks")).values;
    expect(Math.max(...hit)).toBeLessThanOrEqual(100);
    await shot(page, "4-cache-aware.png");
    expect(consoleErrors).toEqual([]);
  });
  it("opened after the traffic, shows the last minutes at once: in-flight and KV use per node from the object's history", async () => {
    // traffic first (the tests above), page second: a new tab has seen nothing yet
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    const consoleErrors: string[] = [];
    page.on("console", (m) => m.type() === "error" && consoleErrors.push(m.text()));
    await page.goto(`${router.url}/status#token=${ADMIN_TOKEN}`);
    const values = (chart: string, series: string) =>
      page.locator(`svg[data-chart="${chart}"] polyline[data-series="${series}"]`).evaluate((el) => JSON.parse(el.getAttribute("data-values") ?? "[]") as number[]);
    await page.locator('svg[data-chart="kv"] polyline[data-series="d0"]').waitFor({ state: "attached" });
    // the page's own polls add a point every 2 s: many points at once can only be the history
    const kv0 = await values("kv", "d0");
    const kv1 = await values("kv", "d1");
    expect(kv0.length).toBeGreaterThanOrEqual(5);
    expect(kv0).toContain(40);
    expect(kv1).toContain(70);
    expect((await values("inflight", "p0")).length).toBeGreaterThanOrEqual(5);
    // prefill-only nodes have no KV chart line
    expect(await page.locator('svg[data-chart="kv"] polyline[data-series="p0"]').count()).toBe(0);
    // the node table shows the engines' figures
    await page.locator('tr[data-node="d1"]').waitFor();
    expect(await page.locator('tr[data-node="d1"]').textContent()).toContain("70%");
    const shots = await mkdtemp(path.join(tmpdir(), "pd-router-status-shots-"));
    await page.screenshot({ path: path.join(shots, "5-history.png"), fullPage: true });
    console.info(`screenshot: ${path.join(shots, "5-history.png")}`);
    expect(consoleErrors).toEqual([]);
  });
});
