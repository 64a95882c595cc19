// A node as the router sees it: a small Node server that answers GET /metrics itself — with an
// engine's real series, or slowly, hugely, garbage or an error — and passes every other request
// through to a simulated engine. Independent of the simulator's own /metrics.
import http from "node:http";
import type { AddressInfo } from "node:net";
import { vllmMetricsText, type EngineFigures } from "./engine-metrics-text";

/** How /metrics answers. */
export type MetricsMode =
  | { mode: "override"; values: EngineFigures }
  /** answers the figures after delayMs (a wedged exporter) */
  | { mode: "slow"; delayMs: number; values?: EngineFigures }
  /** the figures first, then `bytes` of more series (a page far larger than any engine's) */
  | { mode: "huge"; bytes: number; values?: EngineFigures }
  | { mode: "garbage" }
  /** `lines` lines of a read series whose label block is `chars` word characters, then the figures (a hostile exporter) */
  | { mode: "longLabels"; chars: number; lines: number; values?: EngineFigures }
  | { mode: "status"; status: number }
  /** no /metrics at all (404), as before an engine exposes one */
  | { mode: "none" };

export interface FrontStats {
  metricsRequests: number;
  /** /metrics answers still being written */
  metricsPending: number;
  /** /metrics answers whose client closed before the whole page was sent */
  metricsCut: number;
  proxied: number;
}

export interface MetricsFront {
  url: string;
  setTarget(url: string): void;
  set(mode: MetricsMode): void;
  stats(): FrontStats;
  close(): Promise<void>;
}

export async function startMetricsFront(target = ""): Promise<MetricsFront> {
  let upstream = target;
  let mode: MetricsMode = { mode: "none" };
  const stats: FrontStats = { metricsRequests: 0, metricsPending: 0, metricsCut: 0, proxied: 0 };
  const timers = new Set<ReturnType<typeof setTimeout>>();

  const server = http.createServer((req, res) => {
    if (req.method === "GET" && req.url === "/metrics") return metrics(req, res);
    stats.proxied++;
    const out = http.request(`${upstream}${req.url}`, { method: req.method, headers: req.headers, agent: false }, (up) => {
      res.writeHead(up.statusCode ?? 502, up.headers);
      up.pipe(res);
    });
    out.on("error", () => res.destroy());
    res.on("close", () => out.destroy());
    req.pipe(out);
  });

  function metrics(_req: http.IncomingMessage, res: http.ServerResponse) {
    stats.metricsRequests++;
    const m = mode;
    const text = (v?: EngineFigures) => vllmMetricsText(v ?? { kvUsage: 0.1, waiting: 0, running: 1 });
    const send = (status: number, body: string) => {
      res.writeHead(status, { "content-type": "text/plain; version=0.0.4; charset=utf-8" });
      res.end(body);
    };
    switch (m.mode) {
      case "none":
        return send(404, "Not Found");
      case "override":
        return send(200, text(m.values));
      case "garbage":
        return send(200, "<html><body>\u0000\u00ff not prometheus {{{ vllm:kv_cache_usage_perc{ oops 0.99 \n".repeat(50));
      case "longLabels":
        return send(200, `vllm:num_requests_running{${"a".repeat(m.chars)}} 1\n`.repeat(m.lines) + text(m.values));
      case "status":
        return send(m.status, '{"error":"Unauthorized"}');
      case "slow": {
        stats.metricsPending++;
        const timer = setTimeout(() => {
          timers.delete(timer);
          stats.metricsPending--;
          if (!res.destroyed) send(200, text(m.values));
        }, m.delayMs);
        timers.add(timer);
        res.on("close", () => {
          if (timers.delete(timer)) {
            clearTimeout(timer);
            stats.metricsPending--;
          }
        });
        return;
      }
      case "huge": {
        res.writeHead(200, { "content-type": "text/plain; version=0.0.4; charset=utf-8" });
        res.write(text(m.values));
        stats.metricsPending++;
        let sent = 0;
        const line = `vllm:request_prompt_tokens_bucket{engine="0",le="1.0",model_name="sim-model"} 0.0\n`;
        const chunk = line.repeat(Math.ceil(16384 / line.length));
        let done = false;
        const finish = (cut: boolean) => {
          if (done) return;
          done = true;
          stats.metricsPending--;
          if (cut) stats.metricsCut++;
        };
        res.on("close", () => finish(sent < m.bytes));
        const pump = () => {
          while (sent < m.bytes) {
            sent += chunk.length;
            if (!res.write(chunk)) return void res.once("drain", pump);
          }
          res.end(() => finish(false));
        };
        pump();
        return;
      }
    }
  }

  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    setTarget: (url) => {
      upstream = url;
    },
    set: (m) => {
      mode = m;
    },
    stats: () => ({ ...stats }),
    close: async () => {
      for (const t of timers) clearTimeout(t);
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
