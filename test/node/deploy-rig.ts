// Rig of the deployment tests (test/node/deploy-*.test.ts): the real Worker in workerd through
// Miniflare in this process, so a test can give it bindings a deployed router would have — a
// stand-in for a Workers VPC binding, Access secrets — and watch what goes through them. Not a
// test file itself.
//
// The stand-in VPC binding is a Miniflare service binding to a Node handler that does what a
// `vpc_networks` binding does (developers.cloudflare.com/workers-vpc/configuration/vpc-networks/):
// it takes a request for a private address and delivers it there — here, to an engine on
// 127.0.0.1 that the test maps the private address to. It records every request that went
// through it, with its headers, before passing it on byte for byte (both bodies streamed).
import { readFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import http from "node:http";
import { tmpdir } from "node:os";
import path from "node:path";
import { build } from "esbuild";
import { Miniflare } from "miniflare";

const ROOT = path.resolve(__dirname, "../..");

export interface Passage {
  method: string;
  /** the URL the Worker asked the binding for */
  url: string;
  headers: Record<string, string>;
  at: number;
}

export interface StandInBinding {
  /** private origin (as the document names it) -> the 127.0.0.1 origin it reaches */
  map: Map<string, string>;
  passages: Passage[];
}

export interface DeployRig {
  /** sends a request to the Worker (Node's fetch over a socket into workerd) */
  fetch(path: string, init?: RequestInit): Promise<Response>;
  putDocument(doc: unknown): Promise<void>;
  /** every line workerd wrote (the router's JSON log lines among them) */
  lines(): string[];
  bindings: Record<string, StandInBinding>;
  stop(): Promise<void>;
}

export const ADMIN_TOKEN = "deploy-admin-token";

let bundle: Promise<string> | null = null;

/** The Worker bundled once per test file (esbuild, as scripts/workerd-router.mjs does). */
function workerBundle(): Promise<string> {
  bundle ??= (async () => {
    const dir = await mkdtemp(path.join(tmpdir(), "pd-router-deploy-"));
    await build({
      entryPoints: [path.join(ROOT, "src/index.ts")],
      bundle: true,
      format: "esm",
      platform: "neutral",
      mainFields: ["module", "main"],
      conditions: ["workerd", "worker", "browser"],
      external: ["cloudflare:*", "node:*"],
      outfile: path.join(dir, "worker.mjs"),
      logLevel: "warning",
    });
    return dir;
  })();
  return bundle;
}

/** A Node handler that forwards what the Worker sends through the binding to the mapped origin, and records it. */
function standIn(binding: StandInBinding) {
  return (req: http.IncomingMessage, res: http.ServerResponse) => {
    const host = req.headers.host ?? "";
    const url = `http://${host}${req.url ?? "/"}`;
    const headers = Object.fromEntries(Object.entries(req.headers).map(([k, v]) => [k, Array.isArray(v) ? v.join(", ") : (v ?? "")]));
    binding.passages.push({ method: req.method ?? "GET", url, headers, at: Date.now() });
    const target = binding.map.get(`http://${host}`);
    if (!target) {
      // a tunnel with no route to that address: the binding's fetch throws
      res.destroy();
      return;
    }
    const to = new URL(target);
    const upstream = http.request({ host: to.hostname, port: to.port, method: req.method, path: req.url, headers: { ...req.headers, host: to.host } }, (answer) => {
      res.writeHead(answer.statusCode ?? 502, answer.headers);
      answer.pipe(res);
    });
    upstream.on("error", () => res.destroy());
    res.on("close", () => upstream.destroy());
    req.pipe(upstream);
  };
}

export interface DeployRigOptions {
  /** vars and secrets (CONFIG_TTL_MS 0 and ADMIN_TOKEN are set) */
  vars?: Record<string, string>;
  /** stand-in VPC bindings by name, each with its private-origin map */
  bindings?: Record<string, Record<string, string>>;
}

/** The assets/ directory as the ASSETS binding serves it (only the status page lives there). */
function staticAssets(req: http.IncomingMessage, res: http.ServerResponse): void {
  const file = path.join(ROOT, "assets", path.normalize(new URL(req.url ?? "/", "http://assets").pathname));
  try {
    res.writeHead(200, { "content-type": "text/html; charset=utf-8" }).end(readFileSync(file));
  } catch {
    res.writeHead(404).end();
  }
}

export async function startDeployRig(o: DeployRigOptions = {}): Promise<DeployRig> {
  const dir = await workerBundle();
  const toml = readFileSync(path.join(ROOT, "wrangler.toml"), "utf8");
  const compatibilityDate = /compatibility_date\s*=\s*"([^"]+)"/.exec(toml)?.[1];
  const compatibilityFlags = JSON.parse(/compatibility_flags\s*=\s*(\[[^\]]*\])/.exec(toml)?.[1] ?? "[]") as string[];
  const persist = await mkdtemp(path.join(tmpdir(), "pd-router-deploy-state-"));
  const bindings: Record<string, StandInBinding> = {};
  for (const [name, map] of Object.entries(o.bindings ?? {})) bindings[name] = { map: new Map(Object.entries(map)), passages: [] };
  const lines: string[] = [];
  const collect = (stream: NodeJS.ReadableStream) => {
    let pending = "";
    stream.on("data", (chunk: Buffer) => {
      const parts = (pending + chunk.toString("utf8")).split("\n");
      pending = parts.pop() ?? "";
      lines.push(...parts.filter(Boolean));
    });
  };
  const mf = new Miniflare({
    modules: true,
    modulesRoot: dir,
    scriptPath: path.join(dir, "worker.mjs"),
    ...(compatibilityDate ? { compatibilityDate } : {}),
    compatibilityFlags,
    kvNamespaces: ["NODES"],
    durableObjects: { CLUSTER_STATE: { className: "ClusterState", useSQLite: true } },
    kvPersist: path.join(persist, "kv"),
    durableObjectsPersist: path.join(persist, "do"),
    bindings: { CONFIG_TTL_MS: "0", ADMIN_TOKEN, ...o.vars },
    serviceBindings: {
      ...Object.fromEntries(Object.entries(bindings).map(([name, b]) => [name, { node: standIn(b) }])),
      // wrangler.toml's [assets]: the status page, read by the Worker through its ASSETS binding
      ASSETS: { node: staticAssets },
    },
    handleRuntimeStdio(stdout, stderr) {
      collect(stdout);
      collect(stderr);
    },
  });
  const url = await mf.ready;
  const kv = await mf.getKVNamespace("NODES");
  return {
    fetch: (p, init) => fetch(new URL(p, url), init),
    putDocument: async (doc) => {
      await kv.put("nodes", JSON.stringify(doc));
    },
    lines: () => lines,
    bindings,
    async stop() {
      await mf.dispose();
      await rm(persist, { recursive: true, force: true });
    },
  };
}

export const admin = { authorization: `Bearer ${ADMIN_TOKEN}` };

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Polls `read` until `ok`; throws naming what was awaited and the last value seen. */
export async function until<T>(what: string, read: () => Promise<T> | T, ok: (v: T) => boolean, ms = 5000): Promise<T> {
  const deadline = Date.now() + ms;
  let last = await read();
  while (!ok(last)) {
    if (Date.now() > deadline) throw new Error(`${what}: not reached within ${ms} ms; last seen ${JSON.stringify(last)}`);
    await sleep(25);
    last = await read();
  }
  return last;
}

/** The router's log lines with `event` (JSON objects it printed). */
export function events(rig: DeployRig, event: string): Array<Record<string, unknown>> {
  return rig
    .lines()
    .filter((l) => l.includes(`"event":"${event}"`))
    .map((l) => JSON.parse(l.slice(l.indexOf("{"))) as Record<string, unknown>);
}

/** A small HTTP server on 127.0.0.1 (a fake engine, bootstrap server or proxy); resolves with its origin. */
export async function serve(handler: http.RequestListener): Promise<{ url: string; close: () => Promise<void> }> {
  const server = http.createServer(handler);
  const sockets = new Set<import("node:net").Socket>();
  server.on("connection", (s) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const { port } = server.address() as import("node:net").AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}

/** Reads a request body as text. */
export function bodyOf(req: http.IncomingMessage): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")));
    req.on("error", reject);
  });
}

export function json(res: http.ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text), ...headers });
  res.end(text);
}
