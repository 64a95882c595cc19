import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { chromium, type Browser } from "playwright-core";
// @ts-expect-error plain JS module of the simulator
import { startSimCluster } from "../../sim/cluster.mjs";
// @ts-expect-error plain JS module
import { startRouter } from "../../scripts/router-process.mjs";

// What the status page's browser tests share: 2P+2D simulated engines, the router over them in
// its own workerd (real TCP, a persisted state directory of its own), and a headless Chromium.

const CHROMIUM = process.env.CHROMIUM_PATH ?? "/usr/bin/chromium";

/** Two prefill and two decode engines (p0, p1, d0, d1), fast simulated time. */
export function startFourEngines(): Promise<any> {
  return startSimCluster({
    defaults: { timeScale: 0.01 },
    engines: [
      { id: "p0", role: "prefill" },
      { id: "p1", role: "prefill" },
      { id: "d0", role: "decode" },
      { id: "d1", role: "decode" },
    ],
  });
}

/** Those four engines as document nodes, two groups (rack-a: p0 and d0, rack-b: p1 and d1), each at `url(id)`. */
export const fourNodes = (url: (id: string) => string) => [
  { id: "p0", url: url("p0"), role: "prefill", group: "rack-a" },
  { id: "p1", url: url("p1"), role: "prefill", group: "rack-b" },
  { id: "d0", url: url("d0"), role: "decode", group: "rack-a" },
  { id: "d1", url: url("d1"), role: "decode", group: "rack-b" },
];

export interface TestRouter {
  url: string;
  output: () => string;
  /** stops the router and removes its state directory */
  stop: () => Promise<void>;
}

/** The router with this document and admin token, its state in a fresh temporary directory. */
export async function startTestRouter(adminToken: string, clusterDocument: object): Promise<TestRouter> {
  const persistDir = await mkdtemp(path.join(tmpdir(), "pd-router-e2e-"));
  try {
    const router = await startRouter({
      // wrangler binds free ports itself (one picked beforehand can be taken while it starts)
      port: 0,
      inspectorPort: 0,
      persistDir,
      vars: { ADMIN_TOKEN: adminToken, CONFIG_TTL_MS: 0 },
      clusterDocument,
    });
    return {
      url: router.url,
      output: router.output,
      stop: async () => {
        await router.stop();
        await rm(persistDir, { recursive: true, force: true });
      },
    };
  } catch (error) {
    await rm(persistDir, { recursive: true, force: true });
    throw error;
  }
}

/** A headless Chromium (the system's, or CHROMIUM_PATH). */
export function launchChromium(): Promise<Browser> {
  return chromium.launch({
    executablePath: CHROMIUM,
    args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"],
  });
}
