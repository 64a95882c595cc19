// Active health probes over TCP (docs/routing.md, Health): the Durable Object's alarm GETs each node's
// probe path within probeTimeoutMs, and a redirect is a failed probe, never followed. The nodes
// here are small servers that model what goes wrong: one accepts the connection and never answers
// (a wedged process behind a live port), one answers its /health with a 302 to a healthy address
// (a proxy or login page in front of the engine).
import http from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startRig, until, type Rig } from "./lifecycle-harness";

/**
 * Every node gets it, the healthy ones too: far above what a healthy answer takes on a busy
 * machine (300 ms marked a healthy node down there), and below the interval as it must be.
 */
const PROBE_TIMEOUT_MS = 1500;

interface Probed {
  url: string;
  /** probe requests received, and connections the prober closed before an answer */
  hits: number;
  abandoned: number;
  close(): Promise<void>;
}

function serve(handle: (req: http.IncomingMessage, res: http.ServerResponse, self: Probed) => void): Promise<Probed> {
  const server = http.createServer((req, res) => {
    self.hits++;
    res.on("close", () => {
      if (!res.writableEnded) self.abandoned++;
    });
    handle(req, res, self);
  });
  const self: Probed = {
    url: "",
    hits: 0,
    abandoned: 0,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
  return new Promise((resolve) =>
    server.listen(0, "127.0.0.1", () => {
      self.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
      resolve(self);
    }),
  );
}

let rig: Rig;
let hangs: Probed;
let redirects: Probed;
let target: Probed;

beforeAll(async () => {
  target = await serve((_req, res) => res.end('{"status":"ok"}'));
  hangs = await serve(() => undefined);
  redirects = await serve((req, res) => {
    res.writeHead(302, { location: `${target.url}${req.url}` });
    res.end();
  });
  rig = await startRig({
    engines: [
      { id: "p0", role: "prefill" },
      { id: "d0", role: "decode" },
    ],
    document: (url) => ({
      protocol: "vllm",
      // a probe every 2 s, one failed probe marks a node down (and one good one up again)
      health: { intervalMs: 2000, probeTimeoutMs: PROBE_TIMEOUT_MS, downAfter: 1, upAfter: 1 },
      nodes: [
        { id: "p0", url: url("p0"), role: "prefill" },
        { id: "d0", url: url("d0"), role: "decode" },
        { id: "hangs", url: hangs.url, role: "decode" },
        { id: "redirects", url: redirects.url, role: "decode" },
      ],
    }),
  });
}, 120000);

afterAll(async () => {
  await rig?.stop();
  await Promise.all([hangs, redirects, target].map((s) => s?.close()));
});

describe("active probes", () => {
  it("mark down a node that does not answer within probeTimeoutMs and one that redirects; the redirect is not followed", async () => {
    // the first view of the document the object gets (here: the admin status) arms its alarm
    const up = (s: { nodes: Array<{ id: string; probeUp: boolean }> }, id: string) => s.nodes.find((n) => n.id === id)?.probeUp;
    const { value } = await until(
      "both bad nodes probed down, the good ones up",
      () => rig.adminStatus(),
      (s) => up(s, "hangs") === false && up(s, "redirects") === false && up(s, "p0") === true && up(s, "d0") === true,
      20000,
    );
    const probeUp = Object.fromEntries(value.nodes.map((n) => [n.id, n.probeUp]));
    expect(probeUp).toEqual({ p0: true, d0: true, hangs: false, redirects: false });
    // the silent node was asked, and the prober gave up on it (closed the connection unanswered)
    expect(hangs.hits).toBeGreaterThan(0);
    await until(
      "the prober closing the silent probe",
      async () => hangs.abandoned,
      (n) => n > 0,
      5000,
    );
    // the redirect was answered, and nobody went where it pointed
    expect(redirects.hits).toBeGreaterThan(0);
    expect(target.hits).toBe(0);
    // probes that fail are no requests: no node failure is counted
    expect(value.nodes.every((n) => n.failuresTotal === 0)).toBe(true);
    const metrics = await rig.metrics();
    expect(metrics).toContain('pd_router_node_probe_up{node="hangs"} 0');
    expect(metrics).toContain('pd_router_node_healthy{node="redirects"} 0');
    expect(metrics).toContain('pd_router_node_probe_up{node="d0"} 1');
  });
});
