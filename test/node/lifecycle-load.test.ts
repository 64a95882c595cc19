// Issue 11, items 8 and 13 and the soak, over real TCP against the Worker in workerd: huge SSE
// lines, bursts after idle time and across a document refresh, and 200 concurrent streams whose
// clients and engines misbehave at random. Afterwards nothing is held: no lease, no in-flight
// load, no upstream connection.
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { RawClient, chatBody, expectEnginesIdle, expectReleased, idle, request, sleep, startRig, until, workerdFigures, type Rig } from "./lifecycle-harness";

// a client that reads nothing, or a D that sends nothing, for this long is stalled: 4 s, because on
// a 2-core machine with busy loops beside the suite a healthy stream's reader (this process) or
// relay (workerd) can be off the CPU for more than a second (1 s cut a 16 MB line at 5 MB)
const STALL_MS = 4000;
// prefillMs and decodeFirstByteMs well above what 200 streams take on a busy 2-core machine: no
// fault here makes a node silent before its first byte, so a 504 there would be the host's load
// (46 of 200 at 2 s, with four test files beside it), not the router's behaviour
const TIMEOUTS = { prefillMs: 6000, decodeFirstByteMs: 6000, decodeIdleMs: STALL_MS, nonStreamMs: 6000 };
const CONFIG_TTL_MS = 1000;

let rig: Rig;
let doc: any;
const document = (url: (id: string) => string) => ({
  protocol: "vllm",
  policy: { prefill: "least_load", decode: "least_load" },
  timeouts: TIMEOUTS,
  health: { ejectAfter: 100 },
  nodes: [
    { id: "p0", url: url("p0"), role: "prefill" },
    { id: "p1", url: url("p1"), role: "prefill" },
    { id: "d0", url: url("d0"), role: "decode" },
    { id: "d1", url: url("d1"), role: "decode" },
  ],
});

beforeAll(async () => {
  rig = await startRig({
    // fast engines that do not slow down with concurrency: the router is what is under test
    engineDefaults: { decodeBaseMs: 5, decodeMsPerSeq: 0, transferInterferenceMs: 0, transferMsPerBlock: 0 },
    engines: [
      { id: "p0", role: "prefill" },
      { id: "p1", role: "prefill" },
      { id: "d0", role: "decode" },
      { id: "d1", role: "decode" },
    ],
    vars: { LEASE_TTL_MS: 3000, CLIENT_STALL_MS: STALL_MS, CONFIG_TTL_MS },
    document: (url) => (doc = document(url)),
  });
}, 120000);

afterAll(async () => {
  await rig?.stop();
});

beforeEach(async () => {
  await rig.reset();
});

describe("8. SSE rewriting stays linear and bounded: huge lines pass through", () => {
  it("one 16 MB usage line (usage rewriting on): the client gets every byte within seconds, workerd's CPU and memory bounded", async (ctx) => {
    const MB16 = 16 << 20;
    for (const d of ["d0", "d1"]) rig.engine(d).setFault({ mode: "flood", bytes: MB16, newline: true });
    const before = await workerdFigures(rig, ctx);
    let peakKb = before.rssKb;
    const started = Date.now();
    const client = new RawClient(rig.port, { body: chatBody({ stream: true, stream_options: { include_usage: true } }) });
    const sampler = setInterval(() => void rig.workerd().then((w) => w && (peakKb = Math.max(peakKb, w.rssKb))), 100);
    const ended = await client.waitEnded(40000);
    clearInterval(sampler);
    const ms = Date.now() - started;
    const after = await workerdFigures(rig, ctx);
    expect(ended).toBe(true);
    expect(client.bytes).toBeGreaterThan(MB16);
    expect(client.tailText()).toContain('"}\n\ndata: [DONE]\n\n');
    // wall time bounds only a hang (a starved machine is slow); what tells linear from quadratic is
    // workerd's CPU: 27 s for this line before issue 11, a linear pass well under a few seconds
    expect(ms).toBeLessThan(30000);
    expect(after.cpuMs - before.cpuMs).toBeLessThan(4000);
    expect(peakKb - before.rssKb).toBeLessThan(200 * 1024);
    console.info(`[8a] 16 MB line: ${ms} ms, workerd CPU ${after.cpuMs - before.cpuMs} ms, RSS ${before.rssKb >> 10} -> peak ${peakKb >> 10} MB`);
    await expectReleased(rig, 10000);
  });

  it("a D that never sends a newline (48 MB of one line): the bytes flow on, memory does not grow with them", async (ctx) => {
    const MB48 = 48 << 20;
    for (const d of ["d0", "d1"]) rig.engine(d).setFault({ mode: "flood", bytes: MB48, newline: false });
    const before = await workerdFigures(rig, ctx);
    let peakKb = before.rssKb;
    const client = new RawClient(rig.port, { body: chatBody({ stream: true, stream_options: { include_usage: true } }) });
    const sampler = setInterval(() => void rig.workerd().then((w) => w && (peakKb = Math.max(peakKb, w.rssKb))), 100);
    const ended = await client.waitEnded(20000);
    clearInterval(sampler);
    expect(ended).toBe(true);
    expect(client.bytes).toBeGreaterThan(MB48);
    // the router holds at most MAX_DATA_LINE_BYTES (1 MB) of a line; what it passes on is not kept
    expect(peakKb - before.rssKb).toBeLessThan(200 * 1024);
    console.info(`[8b] 48 MB without a newline: RSS ${before.rssKb >> 10} -> peak ${peakKb >> 10} MB`);
    await expectReleased(rig, 10000);
  });
});

describe("13. a concurrency-64 burst is answered, after idle time and across a document refresh", () => {
  const burst = (k: number) =>
    Promise.all(
      Array.from({ length: k }, () =>
        request(rig.url, { body: chatBody({ max_tokens: 4 }), timeoutMs: 15000 }).catch((e: Error) => ({ status: -1, body: String(e), headers: {}, ms: 0 })),
      ),
    );

  it("64 at once after the config cache went stale (idle), then 3 more waves while the document is re-put", async () => {
    await sleep(CONFIG_TTL_MS * 2);
    const first = await burst(64);
    const statuses = (rs: Array<{ status: number }>) => rs.reduce<Record<number, number>>((m, r) => ((m[r.status] = (m[r.status] ?? 0) + 1), m), {});
    expect(statuses(first)).toEqual({ 200: 64 });
    expect(first.some((r) => r.body.includes("hung"))).toBe(false);

    await sleep(CONFIG_TTL_MS * 2);
    const waves = [burst(64), sleep(150).then(() => burst(64)), sleep(300).then(() => burst(64))];
    // mid-burst: a new document (same nodes, another policy) becomes the one served
    await sleep(100);
    await rig.putDocument({ ...doc, policy: { prefill: "round_robin", decode: "round_robin" } });
    const results = (await Promise.all(waves)).flat();
    expect(statuses(results)).toEqual({ 200: 192 });
    await expectReleased(rig, 10000);
    await rig.putDocument(doc);
  });
});

describe("soak: 200 concurrent streams, clients leaving at random moments, engines that stall, reset and answer garbage", () => {
  it("every request ends once; load, leases and upstream connections return to 0", async () => {
    const N = 200;
    // a share of every engine's requests misbehaves (faults are taken by the first requests to arrive)
    rig.engine("p0").setFault({ mode: "reset", count: 12 });
    rig.engine("p1").setFault({ mode: "respond", status: 200, headers: { "content-type": "application/json" }, body: "<html>not json</html>", count: 12 });
    rig.engine("d0").setFault({ mode: "stall", afterChunks: 2, count: 15 });
    rig.engine("d1").setFault({ mode: "respond", status: 200, headers: { "content-type": "text/event-stream" }, body: "data: {garbage\n\nevent: nonsense\n\n", count: 12 });
    let seed = 42;
    const random = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
    const behaviours = ["leave-before-headers", "leave-mid-stream", "stop-reading", "read-all", "read-all"] as const;
    const ids: string[] = [];
    const what = new Map<string, string>();
    /** ms from sending the request to the client leaving (or no longer reading) */
    const leftAfter = new Map<string, number>();
    const paused: RawClient[] = [];
    const outcomes: Record<string, number> = {};
    let readAll = 0;
    const runOne = async (i: number) => {
      const behaviour = behaviours[Math.floor(random() * behaviours.length)]!;
      if (behaviour === "read-all") readAll++;
      const id = `soak-${i}-${Date.now().toString(36)}`;
      ids.push(id);
      const leaveAfterMs = Math.floor(random() * 400);
      await sleep(Math.floor(random() * 300));
      const sentAt = Date.now();
      const client = new RawClient(rig.port, {
        body: chatBody({ stream: true, max_tokens: 20 + Math.floor(random() * 60), stream_options: { include_usage: true } }),
        headers: { "x-request-id": id },
      });
      let seen: string;
      switch (behaviour) {
        case "leave-before-headers":
          await sleep(leaveAfterMs);
          seen = client.response().status ? "left-after-headers" : "left-before-headers";
          client.leave();
          leftAfter.set(id, Date.now() - sentAt);
          break;
        case "leave-mid-stream":
          await client.waitFor((t) => (t.match(/data: /g) ?? []).length >= 3, 5000);
          client.leave();
          leftAfter.set(id, Date.now() - sentAt);
          seen = "left-mid-stream";
          break;
        case "stop-reading":
          await client.waitFor((t) => t.includes("\r\n\r\n"), 5000);
          // it never reads again nor leaves: only the router's stall detection can let it go
          client.socket.pause();
          leftAfter.set(id, Date.now() - sentAt);
          paused.push(client);
          seen = client.ended ? "ended-before-pause" : "stopped-reading";
          break;
        default: {
          await client.waitEnded(15000);
          const { status, body } = client.response();
          // (a D that ends its stream cleanly after garbage, without [DONE], is passed on and then
          // ended with `event: error`, README "a stream that ends cleanly without [DONE]": the
          // garbage alone, without that error, would be a client told nothing went wrong)
          seen =
            status === 200
              ? body.includes("[DONE]")
                ? "done"
                : body.includes("event: error")
                  ? "error-event"
                  : body.includes("{garbage")
                    ? "garbage-passed-on"
                    : "200-without-end"
              : `status-${status}`;
          client.leave();
        }
      }
      outcomes[seen] = (outcomes[seen] ?? 0) + 1;
      what.set(id, seen);
    };
    /** client request ids that reached an engine (upstream ids start with the client's id) */
    const reachedEngines = () => {
      const out = new Set<string>();
      for (const e of ["p0", "p1", "d0", "d1"])
        for (const r of rig.engine(e).requests() as Array<{ headers: Record<string, string> }>) out.add(/^soak-\d+-[a-z0-9]+/.exec(r.headers["x-request-id"] ?? "")?.[0] ?? "");
      return out;
    };
    await Promise.all(Array.from({ length: N }, (_, i) => runOne(i)));
    const clientsDone = Date.now();
    // Bound: the slowest a request can take to notice it is alone — P's timeout, D's first byte,
    // then CLIENT_STALL_MS for the first write nobody reads — plus 5 s of slack for a starved machine.
    const bound = TIMEOUTS.prefillMs + TIMEOUTS.decodeFirstByteMs + STALL_MS + 5000;
    const statusAtEnd = await rig.adminStatus();
    const released = await until("leases released and in-flight 0", () => rig.adminStatus(), idle, bound).catch((e: Error) => e);
    const toZeroMs = Date.now() - clientsDone;
    if (released instanceof Error) {
      // what is still held, for the report: requests with no log line yet, by what their client did
      const engines = await rig.engineStats();
      const heldNow = await rig.adminStatus();
      console.info(
        `[soak] held: leases ${heldNow.leases}, nodes ${JSON.stringify(heldNow.nodes.map((n) => [n.id, n.inflight]))}, engines in flight ${JSON.stringify(Object.values(engines).map((e) => e.inflight))}`,
      );
      await until("released at all", () => rig.adminStatus(), idle, 20000).catch(() => undefined);
      const unlogged = ids.filter((id) => rig.requestLogs(id).length === 0).map((id) => what.get(id));
      throw new Error(
        `${released.message}\nheld after ${toZeroMs} ms; released after ${Date.now() - clientsDone} ms; requests without a log line by client behaviour: ${JSON.stringify(unlogged)}; expired: ${rig.lines().filter((l) => l.includes("lease_expired")).length}`,
      );
    }
    await expectEnginesIdle(rig, 10000);
    const toNoConnectionMs = Date.now() - clientsDone;
    console.info(
      `[soak] outcomes ${JSON.stringify(outcomes)}; at the clients' end: ${statusAtEnd.leases} leases; leases and load 0 after ${toZeroMs} ms, upstream connections 0 after ${toNoConnectionMs} ms (bound ${bound} ms)`,
    );

    // a client that read to the end got the whole answer unless a fault took its request: each
    // injected fault (a P reset or bad answer that failover could not mend, a D that stalled or
    // sent garbage) spoils at most one request
    const faults = Object.values(await rig.engineStats()).reduce((n, e) => n + e.faultsInjected, 0);
    expect(faults).toBeGreaterThan(0);
    expect(readAll).toBeGreaterThan(faults);
    expect(outcomes.done ?? 0, JSON.stringify({ outcomes, readAll, faults })).toBeGreaterThanOrEqual(readAll - faults);
    // and never saw a silent truncation (garbage included) nor an internal error
    expect(outcomes["200-without-end"] ?? 0).toBe(0);
    expect(outcomes["garbage-passed-on"] ?? 0).toBe(0);
    expect(outcomes["status-500"] ?? 0).toBe(0);
    expect(Object.keys(outcomes).filter((k) => k.startsWith("status-") && !/^status-(502|503|504)$/.test(k))).toEqual([]);
    // every request wrote exactly one log line, and none was left to expire
    await sleep(500);
    const lines = ids.map((id) => rig.requestLogs(id).length);
    const reached = reachedEngines();
    const histogram = lines.reduce<Record<number, number>>((m, k) => ((m[k] = (m[k] ?? 0) + 1), m), {});
    console.info(`[soak] log lines per request: ${JSON.stringify(histogram)}; ${reached.size} of ${N} reached an engine`);
    // per request, from its client leaving (or pausing) to its end() (the log line's totalMs)
    const delays: Record<string, number> = {};
    for (const id of ids) {
      const log = rig.requestLogs(id)[0];
      const left = leftAfter.get(id);
      if (!log || left === undefined || what.get(id) === "ended-before-pause") continue;
      const k = what.get(id)!;
      delays[k] = Math.max(delays[k] ?? 0, Number(log.totalMs) - left);
    }
    console.info(`[soak] worst time from the client leaving to the request's end, by what the client did: ${JSON.stringify(delays)}`);
    for (const c of paused) c.leave();
    // Never two. None for a request only when it never reached an engine: workerd may drop a
    // request whose client left before the Worker ran (no lease was taken then).
    expect(lines.filter((k) => k > 1)).toEqual([]);
    expect(ids.filter((id, i) => lines[i] === 0 && reached.has(id)).map((id) => what.get(id))).toEqual([]);
    expect(rig.lines().filter((l) => l.includes('"event":"lease_expired"'))).toEqual([]);
    expect(rig.lines().filter((l) => l.includes('"event":"unhandled_error"'))).toEqual([]);
  }, 60000);
});
