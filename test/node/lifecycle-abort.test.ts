// Issue 11, items 1-4, over real TCP against the Worker in workerd: clients that leave before the
// response starts, a D that falls silent, bodies that break, streams longer than a lease's TTL.
// One P and one D, so no failover blurs what a fault does; timeouts, CLIENT_STALL_MS and
// LEASE_TTL_MS are small so each case ends in about a second.
// A client leaves with a reset (RawClient.leave): workerd then cancels the request and aborts
// request.signal, as Cloudflare does for a client that disconnects, so the departures here are
// seen through the client-abort listener (RequestLife's constructor), not at a later write; they
// fail with it removed. A FIN-only close is not seen locally until a write: docs/testing.md,
// "Clients that leave".
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { RawClient, chatBody, expectEnginesIdle, expectOneLogLine, expectReleased, request, sleep, startRig, until, type Rig } from "./lifecycle-harness";

const STALL_MS = 1000;
const LEASE_TTL_MS = 1500;
const TIMEOUTS = { prefillMs: 3000, decodeFirstByteMs: 3000, decodeIdleMs: 800, nonStreamMs: 1500 };
/** scheduling, a Durable Object round trip, the watchdog's period, the admin poll */
const SLACK_MS = 1500;

let rig: Rig;
const doc = (url: (id: string) => string, timeouts = TIMEOUTS) => ({
  protocol: "vllm",
  policy: { prefill: "round_robin", decode: "round_robin" },
  timeouts,
  // no ejection: every case here fails the one D on purpose
  health: { ejectAfter: 100 },
  nodes: [
    { id: "p0", url: url("p0"), role: "prefill" },
    { id: "d0", url: url("d0"), role: "decode" },
  ],
});

beforeAll(async () => {
  rig = await startRig({
    engines: [
      { id: "p0", role: "prefill" },
      { id: "d0", role: "decode" },
    ],
    vars: { LEASE_TTL_MS, CLIENT_STALL_MS: STALL_MS },
    document: (url) => doc(url),
  });
}, 120000);

afterAll(async () => {
  await rig?.stop();
});

beforeEach(async () => {
  await rig.reset();
});

let n = 0;
const newId = (what: string) => `lc-${what}-${Date.now().toString(36)}-${n++}`;

describe("1. a client that leaves (request.signal): legs closed, lease released, one `aborted` log line", () => {
  it.each([
    ["reset", "closes the tab (RST: request.signal fires at once)"],
    ["fin", "closes the socket in order (FIN only: seen when the router's first write to it fails)"],
  ] as const)("a chat app's user leaves while P still prefills: %s — %s", async (how) => {
    const id = newId(`leave-during-p-${how}`);
    rig.engine("p0").setFault({ mode: "slow", delayMs: 1000, count: 1 });
    const client = new RawClient(rig.port, { body: chatBody({ stream: true, max_tokens: 400 }), headers: { "x-request-id": id } });
    await until(
      "P running",
      () => rig.engineStats(),
      (s) => s.p0!.inflight === 1,
      3000,
    );
    client.leave(how);
    const ms = await expectReleased(rig, STALL_MS + SLACK_MS);
    const stats = await expectEnginesIdle(rig, 1000);
    // nobody generated the whole answer for nobody: either P's leg was closed or D's stream was
    expect(stats.p0!.clientAborts + stats.d0!.clientAborts).toBeGreaterThanOrEqual(1);
    expect(stats.d0!.outputTokens).toBeLessThan(400);
    // and P holds no KV handle for it (vLLM would keep an unread one's blocks for 480 s)
    expect(stats.p0!.heldHandles).toBe(0);
    const log = await expectOneLogLine(rig, id);
    expect(log).toMatchObject({ status: 499, outcome: "aborted" });
    console.info(
      `[1a ${how}] released ${ms} ms after the client left; p0 aborts ${stats.p0!.clientAborts}, d0 aborts ${stats.d0!.clientAborts}, d0 tokens ${stats.d0!.outputTokens}`,
    );
  });

  it("a client times out after P answered, before D's first byte (a slow D queue)", async () => {
    const id = newId("leave-before-d");
    rig.engine("d0").setFault({ mode: "slow", delayMs: 1000, count: 1 });
    const client = new RawClient(rig.port, { body: chatBody({ stream: true, max_tokens: 400 }), headers: { "x-request-id": id } });
    await until(
      "P answered, D running",
      () => rig.engineStats(),
      (s) => s.p0!.requests.vllmPrefill === 1 && s.p0!.inflight === 0 && s.d0!.inflight === 1,
      3000,
    );
    client.leave();
    const ms = await expectReleased(rig, STALL_MS + SLACK_MS);
    const stats = await expectEnginesIdle(rig, 1000);
    expect(stats.d0!.clientAborts).toBe(1);
    expect(stats.d0!.outputTokens).toBeLessThan(400);
    expect(stats.p0!.heldHandles).toBe(0);
    const log = await expectOneLogLine(rig, id);
    expect(log).toMatchObject({ status: 499, outcome: "aborted" });
    console.info(`[1b] released ${ms} ms after the client left; d0 tokens ${stats.d0!.outputTokens}`);
  });

  it("a non-streamed request whose client left while P ran still ends once (no lease held, one line)", async () => {
    const id = newId("leave-nonstream");
    rig.engine("p0").setFault({ mode: "slow", delayMs: 800, count: 1 });
    const client = new RawClient(rig.port, { body: chatBody({ max_tokens: 20 }), headers: { "x-request-id": id } });
    await until(
      "P running",
      () => rig.engineStats(),
      (s) => s.p0!.inflight === 1,
      3000,
    );
    client.leave();
    await expectReleased(rig, STALL_MS + SLACK_MS);
    expect((await expectEnginesIdle(rig, 1000)).p0!.clientAborts).toBe(1);
    expect(await expectOneLogLine(rig, id)).toMatchObject({ status: 499, outcome: "aborted" });
  });

  it("a client that leaves while D is stalled (no byte flows, so no write reveals it): a departure at once, never D's failure at decodeIdleMs", async () => {
    const id = newId("leave-d-stalled");
    // D sends its headers and one event, then holds its connection open without a byte more
    rig.engine("d0").setFault({ mode: "stall", afterChunks: 1, count: 1 });
    const failuresBefore = (await rig.adminStatus()).nodes.find((x) => x.id === "d0")!.failuresTotal;
    const client = new RawClient(rig.port, { body: chatBody({ stream: true, max_tokens: 50 }), headers: { "x-request-id": id } });
    expect(await client.waitFor((t) => t.includes("data: {"), 5000)).toBe(true);
    client.leave();
    const ms = await expectReleased(rig, STALL_MS + SLACK_MS);
    // D's connection closed at the engine: the router hung up on it, D did not end it
    const stats = await expectEnginesIdle(rig, 1000);
    expect(stats.d0!.clientAborts).toBe(1);
    const log = await expectOneLogLine(rig, id);
    expect(log).toMatchObject({ status: 499, outcome: "aborted" });
    // nothing charged to D: its failure count and health are as before the request
    const d0 = (await rig.adminStatus()).nodes.find((x) => x.id === "d0")!;
    expect(d0.failuresTotal).toBe(failuresBefore);
    expect(d0.healthy).toBe(true);
    console.info(`[1e] released ${ms} ms after the client left a stalled D (decodeIdleMs ${TIMEOUTS.decodeIdleMs})`);
  });

  it("a client that stops reading mid-stream (a stuck consumer) is let go after CLIENT_STALL_MS", async () => {
    const id = newId("stop-reading");
    // a D that writes fast and much: the unread socket and the router's buffers fill up
    rig.engine("d0").setFault({ mode: "flood", bytes: 64 << 20, newline: true, count: 1 });
    const client = new RawClient(rig.port, { body: chatBody({ stream: true }), headers: { "x-request-id": id } });
    await client.waitFor((t) => t.includes("\r\n\r\n"), 5000);
    client.socket.pause();
    const ms = await expectReleased(rig, 5000 + STALL_MS + SLACK_MS);
    const stats = await expectEnginesIdle(rig, 1000);
    expect(stats.d0!.clientAborts).toBe(1);
    expect(client.bytes).toBeLessThan(64 << 20);
    const log = await expectOneLogLine(rig, id);
    expect(log.status).toBe(499);
    expect(log.outcome).toBe("stalled");
    client.leave();
    console.info(`[1d] released ${ms} ms after the client stopped reading`);
  });
});

describe("2. nothing waits forever after D's headers: decodeIdleMs, nonStreamMs", () => {
  it("a D that falls silent mid-stream (a wedged GPU): `event: error` within decodeIdleMs, lease released", async () => {
    const id = newId("d-silent");
    rig.engine("d0").setFault({ mode: "stall", afterChunks: 3, count: 1 });
    const client = new RawClient(rig.port, { body: chatBody({ stream: true, max_tokens: 50 }), headers: { "x-request-id": id } });
    expect(await client.waitFor((t) => (t.match(/data: \{/g) ?? []).length >= 3, 5000)).toBe(true);
    const silentSince = Date.now();
    expect(await client.waitFor((t) => t.includes("event: error"), TIMEOUTS.decodeIdleMs + SLACK_MS)).toBe(true);
    const waited = Date.now() - silentSince;
    expect(waited).toBeGreaterThanOrEqual(TIMEOUTS.decodeIdleMs - 100);
    // the error event is the stream's last word: the response ends right after it
    expect(await client.waitEnded(1000)).toBe(true);
    const { status, body } = client.response();
    expect(status).toBe(200);
    expect(body).toContain('"code":"upstream_idle_timeout"');
    expect(body).not.toContain("[DONE]");
    await expectReleased(rig, 1000);
    const stats = await expectEnginesIdle(rig, 1000);
    expect(stats.d0!.clientAborts).toBe(1);
    const log = await expectOneLogLine(rig, id);
    expect(log).toMatchObject({ status: 502, outcome: "error" });
    console.info(`[2a] error event ${waited} ms after D fell silent (decodeIdleMs ${TIMEOUTS.decodeIdleMs})`);
  });

  it("a non-streamed answer that stalls half-way: 504 within nonStreamMs, D's connection closed", async () => {
    const id = newId("nonstream-stall");
    rig.engine("d0").setFault({ mode: "stall", count: 1 });
    const res = await request(rig.url, { body: chatBody({ max_tokens: 10 }), headers: { "x-request-id": id } });
    expect(res.status).toBe(504);
    expect(JSON.parse(res.body).error).toMatchObject({ type: "upstream_error", code: "upstream_timeout" });
    expect(res.ms).toBeLessThan(TIMEOUTS.nonStreamMs + SLACK_MS);
    await expectReleased(rig, 1000);
    const stats = await expectEnginesIdle(rig, 1000);
    expect(stats.d0!.clientAborts).toBe(1);
    expect((await expectOneLogLine(rig, id)).status).toBe(504);
  });

  it("a non-streamed answer whose headers never come: 504 within nonStreamMs", async () => {
    rig.engine("d0").setFault({ mode: "hang", count: 1 });
    const res = await request(rig.url, { body: chatBody({ max_tokens: 10 }) });
    expect(res.status).toBe(504);
    expect(res.ms).toBeLessThan(TIMEOUTS.nonStreamMs + SLACK_MS);
    await expectReleased(rig, 1000);
    expect((await expectEnginesIdle(rig, 1000)).d0!.clientAborts).toBe(1);
  });
});

describe("3. a non-streamed body that breaks is a 502 envelope, never a 500 or a clean 200", () => {
  it("D's connection resets half-way through the JSON (a crashed engine): 502 upstream_error, lease released", async () => {
    const id = newId("nonstream-reset");
    rig.engine("d0").setFault({ mode: "midstream", count: 1 });
    const res = await request(rig.url, { body: chatBody({ max_tokens: 10 }), headers: { "x-request-id": id } });
    expect(res.status).toBe(502);
    const error = JSON.parse(res.body).error;
    expect(error).toMatchObject({ type: "upstream_error" });
    expect(error.code).not.toBe("internal_error");
    await expectReleased(rig, 1000);
    await expectEnginesIdle(rig, 1000);
    expect((await expectOneLogLine(rig, id)).status).toBe(502);
    expect(rig.lines().some((l) => l.includes('"event":"unhandled_error"'))).toBe(false);
  });

  it("D ends its 200 cleanly after half a JSON document (a proxy that cut it): 502, not a clean 200", async () => {
    const half = JSON.stringify({ id: "x", object: "chat.completion", choices: [{ index: 0, message: { role: "assistant", content: "hello there" } }] }).slice(0, 40);
    rig.engine("d0").setFault({ mode: "respond", status: 200, headers: { "content-type": "application/json" }, body: half, count: 1 });
    const res = await request(rig.url, { body: chatBody({ max_tokens: 10 }) });
    expect(res.status).toBe(502);
    expect(JSON.parse(res.body).error).toMatchObject({ type: "upstream_error", code: "upstream_unavailable" });
    expect(res.body).not.toContain("hello");
    await expectReleased(rig, 1000);
  });
});

// A lease whose request died expires: test/worker/runtime-leases.test.ts (no client can make
// workerd drop a live request, so that test takes the lease the way a request does and lets it lapse).
describe("4. leases: a stream longer than LEASE_TTL_MS keeps counting as load, and is released once", () => {
  it(`a ${"~4 s"} stream with LEASE_TTL_MS ${LEASE_TTL_MS}: D's in-flight is 1 throughout, 0 after`, async () => {
    const client = new RawClient(rig.port, { body: chatBody({ stream: true, max_tokens: 220 }) });
    await client.waitFor((t) => t.includes("data: {"), 5000);
    const started = Date.now();
    const seen: Array<{ decode: number; leases: number }> = [];
    while (!client.ended) {
      const s = await rig.adminStatus();
      if (client.ended) break;
      seen.push({ decode: s.nodes.find((x) => x.id === "d0")!.inflight.decode, leases: s.leases });
      await sleep(200);
    }
    const lasted = Date.now() - started;
    expect(lasted).toBeGreaterThan(2 * LEASE_TTL_MS);
    expect(client.response().body).toContain("[DONE]");
    // the last sample may race the stream's end; every earlier one must count the stream
    expect(
      seen.slice(0, -1).every((x) => x.decode === 1 && x.leases === 1),
      JSON.stringify(seen),
    ).toBe(true);
    expect(seen.length).toBeGreaterThan(8);
    await expectReleased(rig, 1000);
    expect(rig.lines().some((l) => l.includes('"event":"lease_expired"'))).toBe(false);
  });
});
