// A small HTTP server on 127.0.0.1 whose answers a test scripts request by request, for the
// engine behaviours the simulator does not model at the moment a test needs them (a prefill
// node that fails only once its decode partner has streamed, SSE framings of other servers,
// events of 64 KB). Not a test file itself.
import http from "node:http";
import type net from "node:net";

export interface ScriptedRequest {
  path: string;
  headers: http.IncomingHttpHeaders;
  body: string;
  json: Record<string, unknown>;
  /** the router closed this request's connection before the answer ended */
  closedEarly: boolean;
  /** bytes of body written to the router so far */
  bytesSent: number;
}

export type ScriptedHandler = (req: ScriptedRequest, res: http.ServerResponse) => Promise<void> | void;

export interface ScriptedEngine {
  url: string;
  requests: ScriptedRequest[];
  setHandler(handler: ScriptedHandler): void;
  close(): Promise<void>;
}

export async function startScriptedEngine(handler: ScriptedHandler): Promise<ScriptedEngine> {
  let current = handler;
  const requests: ScriptedRequest[] = [];
  const sockets = new Set<net.Socket>();
  const server = http.createServer((req, res) => {
    // The router's own background reads — health probes and /metrics polls from the cluster
    // object's alarm — get a healthy engine's plain answers; scripts see only the requests a
    // client's request caused.
    if (req.method === "GET" && (req.url === "/health" || req.url === "/metrics")) {
      req.resume();
      res.writeHead(req.url === "/health" ? 200 : 404, { "content-type": "text/plain" });
      res.end(req.url === "/health" ? "" : "no metrics");
      return;
    }
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks).toString("utf8");
      let json: Record<string, unknown> = {};
      try {
        json = JSON.parse(body) as Record<string, unknown>;
      } catch {
        // the script decides what a body that is not JSON gets
      }
      const record: ScriptedRequest = { path: req.url ?? "/", headers: req.headers, body, json, closedEarly: false, bytesSent: 0 };
      requests.push(record);
      res.on("close", () => {
        if (!res.writableFinished) record.closedEarly = true;
      });
      const write = res.write.bind(res);
      res.write = ((chunk: unknown, ...rest: unknown[]) => {
        record.bytesSent += typeof chunk === "string" ? Buffer.byteLength(chunk) : (chunk as Buffer).byteLength;
        return (write as (...a: unknown[]) => boolean)(chunk, ...rest);
      }) as typeof res.write;
      Promise.resolve(current(record, res)).catch(() => res.destroy());
    });
  });
  server.on("connection", (s) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as net.AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    setHandler(h) {
      current = h;
    },
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/** Writes `data` and waits until the socket took it (backpressure: a router that stops reading stops the writer). */
export function writeDrained(res: http.ServerResponse, data: string): Promise<boolean> {
  if (res.destroyed) return Promise.resolve(false);
  if (res.write(data)) return Promise.resolve(true);
  return new Promise((resolve) => {
    const done = (ok: boolean) => {
      res.off("drain", onDrain);
      res.off("close", onClose);
      resolve(ok);
    };
    const onDrain = () => done(true);
    const onClose = () => done(false);
    res.once("drain", onDrain);
    res.once("close", onClose);
  });
}

export const sseHead = (res: http.ServerResponse) => {
  res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
  res.flushHeaders();
};

export const wait = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Resolves once the response closed (the router hung up, or the script ended it). */
export const closed = (res: http.ServerResponse) => new Promise<void>((resolve) => (res.destroyed || res.writableFinished ? resolve() : res.once("close", () => resolve())));
