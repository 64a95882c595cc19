// Shared rig of the issue-11 life-cycle tests (test/node/lifecycle-*.test.ts): the real Worker in
// workerd (Miniflare in its own process) on 127.0.0.1, simulated engines, and clients that are
// plain sockets, so a test decides exactly when a client leaves. Not a test file itself.
import { mkdtemp, readdir, readFile, rm } from "node:fs/promises";
import http from "node:http";
import net from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { expect, type TestContext } from "vitest";
// @ts-expect-error plain JS module of the simulator
import { startSimCluster } from "../../sim/cluster.mjs";
// @ts-expect-error plain JS module
import { startRouter } from "../../scripts/router-process.mjs";
import { seededRandom } from "../support/seeded";
import { freePort } from "../support/free-port";

export { freePort };

export const ADMIN_TOKEN = "lifecycle-admin-token";

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export interface EngineStats {
  clientAborts: number;
  inflight: number;
  outputTokens: number;
  faultsInjected: number;
  requests: { total: number; vllmPrefill: number; vllmDecode: number };
  protocolViolations: number;
  violations: string[];
}

export interface AdminStatus {
  nodes: Array<{ id: string; inflight: { prefill: number; decode: number; tokens: number }; failuresTotal: number; healthy: boolean; probeUp: boolean }>;
  leases: number;
  serving: { version: string | null; stale: boolean };
}

export interface Rig {
  url: string;
  port: number;
  /** workerd's inspector port, when the rig was started with one */
  inspectorPort?: number | undefined;
  cluster: any;
  engine(id: string): any;
  /** every output line of the router process so far */
  lines(): string[];
  /** the router's "event":"request" log lines of one request id */
  requestLogs(requestId: string): Array<Record<string, unknown>>;
  adminStatus(): Promise<AdminStatus>;
  engineStats(): Promise<Record<string, EngineStats>>;
  metrics(): Promise<string>;
  putDocument(doc: unknown): Promise<void>;
  /** workerd's resident set size (kB) and CPU time used so far (ms); null when /proc is not readable */
  workerd(): Promise<{ rssKb: number; cpuMs: number } | null>;
  /** resets every engine (faults, stats) */
  reset(): Promise<void>;
  /**
   * Stops the router and starts it again on the same port and state (KV, Durable Objects), with
   * `document` (an object, or raw text, valid or not) written to KV first: a new isolate, as after
   * a deploy or an eviction, meeting whatever KV holds.
   */
  restart(document: unknown): Promise<void>;
  stop(): Promise<void>;
}

export interface RigOptions {
  engines: Array<{ id: string; role: "prefill" | "decode" | "both" } & Record<string, unknown>>;
  engineDefaults?: Record<string, unknown>;
  /** the cluster document, given each engine's URL and the router's own origin */
  document(url: (id: string) => string, self: string): unknown;
  vars?: Record<string, string | number>;
  /** a RATE_LIMITER binding (none by default) */
  rateLimit?: { limit: number; period: number };
  /** workerd's V8 inspector port (heap figures: scripts/devtools.mjs); 0: a free one workerd binds itself (`Rig.inspectorPort` names it) */
  inspectorPort?: number;
}

export async function startRig(o: RigOptions): Promise<Rig> {
  const cluster = await startSimCluster({ defaults: { timeScale: 1, prefillMsPerToken: 0.01, ...o.engineDefaults }, engines: o.engines });
  const url = (id: string) => cluster.engines.get(id).url as string;
  const persistDir = await mkdtemp(path.join(tmpdir(), "pd-router-lifecycle-"));
  let port = await freePort();
  const all: string[] = [];
  let pending = "";
  let router: { url: string; pid: number; inspectorPort?: number; stop: () => Promise<void> };
  const launch = (clusterDocument: unknown) =>
    startRouter({
      runtime: "workerd",
      port,
      persistDir,
      vars: { ADMIN_TOKEN, CONFIG_TTL_MS: 0, ...o.vars },
      ...(o.rateLimit ? { rateLimit: o.rateLimit } : {}),
      ...(o.inspectorPort !== undefined ? { inspectorPort: o.inspectorPort } : {}),
      clusterDocument,
      onOutput: (line: string) => {
        // startRouter splits each chunk of output at newlines: a line cut by a chunk boundary
        // arrives in two pieces, joined again here (the router's log lines are JSON objects)
        const joined = pending + line;
        pending = "";
        if (joined.startsWith("{") && !joined.endsWith("}") && joined.length < 1_000_000) pending = joined;
        else all.push(joined);
      },
    });
  for (let attempt = 1; ; attempt++) {
    try {
      router = await launch(o.document(url, `http://127.0.0.1:${port}`));
      break;
    } catch (err) {
      // the document names the router's own url, so its port is picked before workerd starts; another
      // process can bind it while esbuild bundles (workerd then exits: "Address already in use")
      if (attempt < 3 && /Address already in use/.test(String(err))) {
        port = await freePort();
        continue;
      }
      await cluster.close();
      throw err;
    }
  }
  const admin = { authorization: `Bearer ${ADMIN_TOKEN}` };
  const rig: Rig = {
    url: router.url,
    port,
    inspectorPort: router.inspectorPort,
    cluster,
    engine: (id) => cluster.engines.get(id),
    lines: () => all,
    requestLogs: (requestId) =>
      all
        .filter((l) => l.includes('"event":"request"') && l.includes(requestId))
        .map((l) => JSON.parse(l.slice(l.indexOf("{"))) as Record<string, unknown>)
        .filter((e) => e.requestId === requestId),
    async adminStatus() {
      const res = await fetch(`${router.url}/admin/status`, { headers: admin });
      expect(res.status).toBe(200);
      return (await res.json()) as AdminStatus;
    },
    async engineStats() {
      return (await (await fetch(`${cluster.controlUrl}/stats`)).json()) as Record<string, EngineStats>;
    },
    async metrics() {
      return (await fetch(`${router.url}/metrics`)).text();
    },
    async putDocument(doc) {
      const res = await fetch(`${router.url}/admin/nodes`, { method: "PUT", headers: { ...admin, "content-type": "application/json" }, body: JSON.stringify(doc) });
      expect(res.status, await res.clone().text()).toBeLessThan(300);
      await res.arrayBuffer();
    },
    async workerd() {
      try {
        // the workerd child of the Miniflare process (router.pid leads its process group)
        const tasks = await readdir(`/proc/${router.pid}/task`);
        const children = (await Promise.all(tasks.map((t) => readFile(`/proc/${router.pid}/task/${t}/children`, "utf8").catch(() => "")))).join(" ");
        for (const pid of children.trim().split(/\s+/).filter(Boolean)) {
          const status = await readFile(`/proc/${pid}/status`, "utf8").catch(() => "");
          if (!/^Name:\s*workerd/m.test(status)) continue;
          const stat = (await readFile(`/proc/${pid}/stat`, "utf8")).split(") ")[1]!.split(" ");
          // fields 14 and 15 (utime, stime) in clock ticks of 10 ms; index 11 and 12 after the name
          return { rssKb: Number(/VmRSS:\s*(\d+)/.exec(status)?.[1]), cpuMs: (Number(stat[11]) + Number(stat[12])) * 10 };
        }
        return null;
      } catch {
        return null;
      }
    },
    async reset() {
      await fetch(`${cluster.controlUrl}/reset`, { method: "POST" });
    },
    async restart(document) {
      await router.stop();
      router = await launch(document);
      rig.inspectorPort = router.inspectorPort;
    },
    async stop() {
      await router?.stop();
      await cluster.close();
      await rm(persistDir, { recursive: true, force: true });
    },
  };
  return rig;
}

export interface PairRigOptions extends Omit<RigOptions, "engines" | "document"> {
  /** members of the cluster document beside protocol, policy, health and nodes (timeouts, ...) */
  document?: Record<string, unknown>;
}

/**
 * The rig of the life-cycle cases that need one P (p0) and one D (d0), so every request meets the
 * same engines: vllm, round robin, and no ejection (cases fail the one D on purpose). Returns the
 * rig and the cluster document it was given (to put back after a case replaced it).
 */
export async function startPairRig(o: PairRigOptions = {}): Promise<{ rig: Rig; document: unknown }> {
  const { document: members, ...options } = o;
  let document: unknown;
  const pair = [
    { id: "p0", role: "prefill" as const },
    { id: "d0", role: "decode" as const },
  ];
  const rig = await startRig({
    ...options,
    engines: pair,
    document: (url) =>
      (document = {
        protocol: "vllm",
        policy: { prefill: "round_robin", decode: "round_robin" },
        ...members,
        health: { ejectAfter: 100 },
        nodes: pair.map(({ id, role }) => ({ id, url: url(id), role })),
      }),
  });
  return { rig, document };
}

/**
 * workerd's memory and CPU so far (Rig.workerd). They come from /proc: where it does not exist
 * (not Linux) the test is reported skipped with the reason, never passed without its bounds; on
 * Linux an unreadable /proc fails the test.
 */
export async function workerdFigures(rig: Rig, ctx: TestContext): Promise<{ rssKb: number; cpuMs: number }> {
  const figures = await rig.workerd();
  if (figures) return figures;
  if (process.platform !== "linux") ctx.skip(`no /proc on ${process.platform}: workerd's CPU and memory cannot be measured, so this bound is not checked`);
  throw new Error("workerd's /proc entries could not be read: its CPU and memory bounds cannot be checked");
}

/** Polls `read` until `ok`; throws naming what was awaited and the last value seen. Resolves with the value and the time it took. */
export async function until<T>(what: string, read: () => Promise<T>, ok: (v: T) => boolean, ms: number): Promise<{ value: T; ms: number }> {
  const start = Date.now();
  let last: T = await read();
  while (!ok(last)) {
    if (Date.now() - start > ms) throw new Error(`${what}: not reached within ${ms} ms; last seen ${JSON.stringify(last)}`);
    await sleep(50);
    last = await read();
  }
  return { value: last, ms: Date.now() - start };
}

export const idle = (s: AdminStatus) => s.leases === 0 && s.nodes.every((n) => n.inflight.prefill + n.inflight.decode === 0);

/** No lease held, no node counting a request, within `ms`; returns how long it took. */
export async function expectReleased(rig: Rig, ms: number): Promise<number> {
  return (await until("leases released and in-flight 0", () => rig.adminStatus(), idle, ms)).ms;
}

/**
 * The request wrote exactly one log line: awaited (the line is written as the request ends; the
 * bound ends a hang), then a moment more for a second one that must not come.
 */
export async function expectOneLogLine(rig: Rig, id: string): Promise<Record<string, unknown>> {
  await until(
    `log line of ${id}`,
    async () => rig.requestLogs(id).length,
    (k) => k > 0,
    5000,
  );
  await sleep(300);
  const logs = rig.requestLogs(id);
  expect(logs).toHaveLength(1);
  return logs[0]!;
}

const IDLE_FLOOR_MS = 5000;

/** No engine has a request open (every upstream connection closed), within `ms`. */
export async function expectEnginesIdle(rig: Rig, ms: number): Promise<Record<string, EngineStats>> {
  return (
    await until(
      "engines idle",
      () => rig.engineStats(),
      (s) => Object.values(s).every((e) => e.inflight === 0),
      // the bound ends a hang, at least 5 s (a starved machine's pause): what a test checks is what
      // the engines saw (client aborts, tokens made for nobody), not how soon the stats were read
      Math.max(ms, IDLE_FLOOR_MS),
    )
  ).value;
}

const random = seededRandom(206);
export function chatBody(extra: Record<string, unknown> = {}): Record<string, unknown> {
  return { model: "sim-model", messages: [{ role: "user", content: `hello ${random()}` }], max_tokens: 8, ...extra };
}

/** A raw HTTP/1.1 request on its own socket: the test decides when the client leaves. */
export class RawClient {
  readonly socket: net.Socket;
  private chunks: Buffer[] = [];
  private joined: Buffer | null = Buffer.alloc(0);
  private count = 0;
  /** the last bytes received (a huge answer is never re-joined just to look at its end) */
  private tail = Buffer.alloc(0);
  private waiters: Array<() => void> = [];
  closed = false;
  readonly connected: Promise<void>;

  constructor(port: number, opts: { path?: string; body: string | Record<string, unknown>; headers?: Record<string, string>; method?: string }) {
    const body = typeof opts.body === "string" ? opts.body : JSON.stringify(opts.body);
    const headers = { host: `127.0.0.1:${port}`, "content-type": "application/json", "content-length": String(Buffer.byteLength(body)), connection: "close", ...opts.headers };
    this.socket = net.connect(port, "127.0.0.1");
    this.connected = new Promise((resolve, reject) => {
      this.socket.once("connect", () => resolve());
      this.socket.once("error", reject);
    });
    this.socket.on("error", () => undefined);
    this.socket.write(
      `${opts.method ?? "POST"} ${opts.path ?? "/v1/chat/completions"} HTTP/1.1\r\n${Object.entries(headers)
        .map(([k, v]) => `${k}: ${v}\r\n`)
        .join("")}\r\n${body}`,
    );
    this.socket.on("data", (d: Buffer) => {
      this.chunks.push(d);
      this.joined = null;
      this.count += d.byteLength;
      this.tail = Buffer.concat([this.tail, d]).subarray(-4096);
      this.wake();
    });
    this.socket.on("close", () => {
      this.closed = true;
      this.wake();
    });
  }

  private wake() {
    for (const w of this.waiters.splice(0)) w();
  }

  /** The response has ended: its last chunk arrived (workerd may keep the socket open) or the socket closed. */
  private get received(): Buffer {
    if (this.joined === null) {
      this.joined = Buffer.concat(this.chunks);
      this.chunks = [this.joined];
    }
    return this.joined;
  }

  /** the last (up to) 4 KB received */
  tailText(): string {
    return this.tail.toString("utf8");
  }

  get ended(): boolean {
    if (this.closed) return true;
    const tail = this.tail.subarray(Math.max(0, this.tail.byteLength - 7)).toString("latin1");
    return tail.endsWith("\r\n0\r\n\r\n") || tail === "0\r\n\r\n";
  }

  get bytes(): number {
    return this.count;
  }

  /** Waits until the response ended (or the socket closed), at most `ms`; true when it did. */
  async waitEnded(ms: number): Promise<boolean> {
    const end = Date.now() + ms;
    while (!this.ended && Date.now() < end) {
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, Math.max(1, end - Date.now()));
        this.waiters.push(() => {
          clearTimeout(t);
          resolve();
        });
      });
    }
    return this.ended;
  }

  text(): string {
    return this.received.toString("utf8");
  }

  /** Waits until what arrived satisfies `ok` (or the socket closed), at most `ms`. */
  async waitFor(ok: (text: string) => boolean, ms: number): Promise<boolean> {
    const end = Date.now() + ms;
    while (!ok(this.text())) {
      if (this.ended || Date.now() > end) return ok(this.text());
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, Math.max(1, end - Date.now()));
        this.waiters.push(() => {
          clearTimeout(t);
          resolve();
        });
      });
    }
    return true;
  }

  /**
   * The client leaves: the socket is reset (RST), as the kernel does for a closed tab or a killed
   * process with data still unread. workerd sees a departure only as a hang-up: its HTTP server
   * cancels the request when the socket reports EPOLLHUP/EPOLLERR (kj HttpServer::listenHttpImpl,
   * whenWriteDisconnected); a FIN alone is a half-close, which HTTP/1.1 allows a client that still
   * reads, so a FIN-only close is not seen until a write fails (docs/testing.md, "Clients that
   * leave"). On that cancel workerd aborts request.signal (worker-entrypoint.c++).
   */
  leave(how: "reset" | "fin" = "reset"): void {
    // "fin": the socket closed in order (a FIN; what a client that read everything it wanted does):
    // the router sees it only when its next write to the socket fails
    if (how === "fin") this.socket.destroy();
    else this.socket.resetAndDestroy();
  }

  /** The response so far: status, headers, body (chunked encoding undone when complete). */
  response(): { status: number; headers: Record<string, string>; body: string } {
    const raw = this.received;
    const end = raw.indexOf("\r\n\r\n");
    if (end < 0) return { status: 0, headers: {}, body: "" };
    const head = raw.subarray(0, end).toString("latin1").split("\r\n");
    const status = Number(head[0]!.split(" ")[1]);
    const headers: Record<string, string> = {};
    for (const line of head.slice(1)) {
      const i = line.indexOf(":");
      headers[line.slice(0, i).trim().toLowerCase()] = line.slice(i + 1).trim();
    }
    let body = raw.subarray(end + 4);
    if (headers["transfer-encoding"] === "chunked") body = dechunk(body);
    return { status, headers, body: body.toString("utf8") };
  }
}

function dechunk(buf: Buffer): Buffer {
  const parts: Buffer[] = [];
  let at = 0;
  for (;;) {
    const nl = buf.indexOf("\r\n", at);
    if (nl < 0) break;
    const size = parseInt(buf.subarray(at, nl).toString("latin1"), 16);
    if (!Number.isFinite(size) || size === 0) break;
    parts.push(buf.subarray(nl + 2, nl + 2 + size));
    at = nl + 2 + size + 2;
  }
  return Buffer.concat(parts);
}

/** A whole request with node:http (no keep-alive pool): status, headers and body text. */
export function request(
  url: string,
  opts: { path?: string; body?: unknown; headers?: Record<string, string>; method?: string; timeoutMs?: number } = {},
): Promise<{ status: number; headers: http.IncomingHttpHeaders; body: string; ms: number }> {
  const started = Date.now();
  return new Promise((resolve, reject) => {
    const body = opts.body === undefined ? undefined : typeof opts.body === "string" ? opts.body : JSON.stringify(opts.body);
    const req = http.request(
      `${url}${opts.path ?? "/v1/chat/completions"}`,
      { method: opts.method ?? "POST", agent: false, headers: { "content-type": "application/json", ...opts.headers }, timeout: opts.timeoutMs ?? 20000 },
      (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString("utf8"), ms: Date.now() - started }));
        res.on("error", reject);
      },
    );
    req.on("timeout", () => req.destroy(new Error(`no answer within ${opts.timeoutMs ?? 20000} ms`)));
    req.on("error", reject);
    req.end(body);
  });
}
