// Issue 19, items 1 and 4, over real TCP against the Worker in workerd: a batched streaming
// /v1/completions (a list of prompts, one P/D pair a prompt, merged into one stream) whose client
// leaves at every moment or stops reading, or one of whose prompts fails; and the cap on prompts a
// request, counted as its prompts by the metrics and the rate limiter. One P and one D, so
// every prompt of a batch meets the same engines; timeouts, CLIENT_STALL_MS and LEASE_TTL_MS are
// small so each case ends in about a second.
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { MAX_BATCH_PROMPTS } from "../../src/forward/batch";
import { RawClient, expectEnginesIdle, expectReleased, request, sleep, startPairRig, until, workerdFigures, type EngineStats, type Rig } from "./lifecycle-harness";
import { startScriptedEngine, sseHead, writeDrained, type ScriptedEngine } from "./scripted-engine";
import { seededRandom } from "../support/seeded";

const STALL_MS = 1000;
const TIMEOUTS = { prefillMs: 3000, decodeFirstByteMs: 3000, decodeIdleMs: 2000, nonStreamMs: 3000 };
/** scheduling, a Durable Object round trip, the watchdog's period, the admin poll */
const SLACK_MS = 1500;
/** D's whole answer takes ~6 s (15 ms a token): far past every bound checked here */
const MAX_TOKENS = 400;

let rig: Rig;
/** a decode node that streams big events as fast as the router takes them (the memory case) */
let fat: ScriptedEngine;
let doc: unknown;
const FAT_EVENTS = 400;
const RATE_LIMIT = 40;
const RATE_PERIOD_S = 60;
const FAT_EVENT_CHARS = 64 << 10;

beforeAll(async () => {
  fat = await startScriptedEngine(async (_req, res) => {
    sseHead(res);
    const text = "x".repeat(FAT_EVENT_CHARS);
    for (let i = 0; i < FAT_EVENTS; i++) {
      const chunk = { id: "cmpl-fat", object: "text_completion", created: 0, model: "sim-model", choices: [{ index: 0, text, logprobs: null, finish_reason: null }] };
      if (!(await writeDrained(res, `data: ${JSON.stringify(chunk)}\n\n`))) return;
    }
    res.end("data: [DONE]\n\n");
  });
  ({ rig, document: doc } = await startPairRig({
    vars: { LEASE_TTL_MS: 3000, CLIENT_STALL_MS: STALL_MS, RATE_LIMIT_PERIOD_S: RATE_PERIOD_S },
    // keyed by the client's address (no API_KEYS here): only requests that send cf-connecting-ip are limited
    rateLimit: { limit: RATE_LIMIT, period: RATE_PERIOD_S },
    document: { timeouts: TIMEOUTS },
  }));
}, 120000);

afterAll(async () => {
  await rig?.stop();
  await fat?.close();
});

beforeEach(async () => {
  await rig.reset();
});

let seq = 0;
const random = seededRandom(74);
const newId = (what: string) => `lcb-${what}-${Date.now().toString(36)}-${seq++}`;
const batchBody = (k: number, extra: Record<string, unknown> = {}) => ({
  model: "sim-model",
  prompt: Array.from({ length: k }, (_, i) => `prompt ${i} of a batch ${random()}`),
  max_tokens: MAX_TOKENS,
  stream: true,
  ...extra,
});

/** Each sub-request of a batch (`<id>/<i>`) wrote exactly one log line, within `ms`; returns them. */
async function oneLinePerPrompt(id: string, k: number, ms: number): Promise<Array<Record<string, unknown>>> {
  const ids = Array.from({ length: k }, (_, i) => `${id}/${i}`);
  await until(
    `log lines of ${id}`,
    async () => ids.filter((x) => rig.requestLogs(x).length > 0).length,
    (n) => n === k,
    ms,
  );
  await sleep(300);
  return ids.map((x) => {
    const logs = rig.requestLogs(x);
    expect(logs, x).toHaveLength(1);
    return logs[0]!;
  });
}

const dataEvents = (t: string) => (t.match(/data: \{/g) ?? []).length;

describe("1. a batched stream whose client leaves: every prompt's legs closed, every lease released, one log line a prompt", () => {
  it.each([
    {
      what: "the client leaves while the prompts' P legs still prefill",
      name: "during-p",
      log: "b1a",
      slow: "p0",
      running: "three P legs running",
      ready: (s: Record<string, EngineStats>) => s.p0!.inflight === 3,
    },
    {
      what: "the client leaves after P answered, before D's first byte",
      name: "before-d",
      log: "b1b",
      slow: "d0",
      running: "P answered all three, D running",
      ready: (s: Record<string, EngineStats>) => s.p0!.requests.vllmPrefill === 3 && s.p0!.inflight === 0 && s.d0!.inflight === 3,
    },
  ])("$what", async ({ name, log, slow, running, ready }) => {
    const id = newId(name);
    rig.engine(slow).setFault({ mode: "slow", delayMs: 1000, count: 3 });
    const client = new RawClient(rig.port, { path: "/v1/completions", body: batchBody(3), headers: { "x-request-id": id } });
    await until(running, () => rig.engineStats(), ready, 3000);
    client.leave();
    // seen at once through request.signal (RawClient.leave resets the socket; workerd aborts the signal)
    const ms = await expectReleased(rig, STALL_MS + SLACK_MS);
    const stats = await expectEnginesIdle(rig, 1000);
    expect(stats.d0!.outputTokens).toBeLessThan(MAX_TOKENS);
    expect(stats.p0!.heldHandles).toBe(0);
    const logs = await oneLinePerPrompt(id, 3, 1000);
    // no write to the client reveals this departure (none is made yet): only request.signal does
    for (const l of logs) expect(l).toMatchObject({ status: 499, outcome: "aborted" });
    console.info(`[${log}] released ${ms} ms after the client left; every prompt ${logs[0]!.outcome}; d0 tokens ${stats.d0!.outputTokens}`);
  });

  it("the client leaves mid-stream: noticed at once, every prompt `aborted`", async () => {
    const id = newId("mid");
    const client = new RawClient(rig.port, { path: "/v1/completions", body: batchBody(3), headers: { "x-request-id": id } });
    expect(await client.waitFor((t) => dataEvents(t) >= 6, 5000)).toBe(true);
    client.leave();
    const ms = await expectReleased(rig, STALL_MS + SLACK_MS);
    const stats = await expectEnginesIdle(rig, 1000);
    expect(stats.d0!.clientAborts).toBe(3);
    expect(stats.d0!.outputTokens).toBeLessThan(3 * MAX_TOKENS);
    const logs = await oneLinePerPrompt(id, 3, 1000);
    for (const l of logs) expect(l).toMatchObject({ status: 499, outcome: "aborted" });
    console.info(`[b1c] released ${ms} ms after the client left mid-stream; d0 tokens ${stats.d0!.outputTokens}`);
  });

  it("one prompt's D breaks mid-stream: the batch ends with an error event, never [DONE]; only that D is blamed, the others' legs close", async () => {
    const id = newId("d-breaks");
    const before = (await rig.adminStatus()).nodes.find((x) => x.id === "d0")!.failuresTotal;
    rig.engine("d0").setFault({ mode: "midstream", afterChunks: 3, count: 1 });
    const client = new RawClient(rig.port, { path: "/v1/completions", body: batchBody(3), headers: { "x-request-id": id } });
    expect(await client.waitEnded(5000)).toBe(true);
    const { status, body } = client.response();
    expect(status).toBe(200);
    expect(body).toContain("event: error");
    expect(body).not.toContain("[DONE]");
    await expectReleased(rig, 2000);
    const stats = await expectEnginesIdle(rig, 1000);
    expect(stats.d0!.outputTokens).toBeLessThan(2 * MAX_TOKENS);
    const logs = await oneLinePerPrompt(id, 3, 1000);
    for (const l of logs) expect(l).toMatchObject({ status: 502, outcome: "error" });
    expect(logs.filter((l) => String(l.error).startsWith("decode stream failed"))).toHaveLength(1);
    expect(logs.filter((l) => String(l.error).startsWith("another prompt of the batch failed"))).toHaveLength(2);
    expect((await rig.adminStatus()).nodes.find((x) => x.id === "d0")!.failuresTotal).toBe(before + 1);
  });

  it("one prompt's P fails while the others prefill: the batch is a 502 at once, the other prompts' legs close", async () => {
    const id = newId("p-fails");
    rig.engine("p0").setFault({ mode: "status500", count: 1 });
    // prompts of ~25k tokens: P prefills each for ~250 ms, one after another, when the first fails
    const body = { ...batchBody(3), prompt: [0, 1, 2].map((i) => `${i} ${"long prompt ".repeat(8000)} ${random()}`) };
    const res = await request(rig.url, { path: "/v1/completions", body, headers: { "x-request-id": id } });
    expect(res.status).toBe(502);
    expect(JSON.parse(res.body).error).toMatchObject({ type: "upstream_error" });
    await expectReleased(rig, STALL_MS + SLACK_MS);
    const stats = await expectEnginesIdle(rig, 1000);
    // the other prompts' prefills were cut, not run to the end for a batch that had failed
    expect(stats.p0!.clientAborts).toBeGreaterThanOrEqual(1);
    expect(stats.d0!.requests.total).toBe(0);
    expect(stats.p0!.heldHandles).toBe(0);
    const logs = await oneLinePerPrompt(id, 3, 1000);
    for (const l of logs) expect(l).toMatchObject({ status: 502, outcome: "error" });
    expect(logs.filter((l) => String(l.error).includes("prefill node p0"))).toHaveLength(1);
    expect(logs.filter((l) => l.error === "another prompt of the batch failed")).toHaveLength(2);
  });

  it("a client that stops reading is cut by the stall bound; workerd holds about what one stream holds, not every prompt's answer", async (ctx) => {
    const total = FAT_EVENTS * FAT_EVENT_CHARS;
    const fatDoc = { protocol: "colocated", timeouts: TIMEOUTS, health: { ejectAfter: 100 }, nodes: [{ id: "f0", url: fat.url, role: "decode" }] };
    await rig.putDocument(fatDoc);
    try {
      /** One non-reading client of `k` prompts: how long until released, workerd's RSS growth, what the engine got rid of. */
      const stuck = async (k: number) => {
        const id = newId(`stuck-${k}`);
        const sentBefore = fat.requests.length;
        const before = await workerdFigures(rig, ctx);
        let peakKb = before.rssKb;
        const sampler = setInterval(() => void rig.workerd().then((w) => w && (peakKb = Math.max(peakKb, w.rssKb))), 50);
        const body = k === 1 ? { model: "sim-model", prompt: "one fat prompt", stream: true } : batchBody(k, { max_tokens: 16 });
        const client = new RawClient(rig.port, { path: "/v1/completions", body, headers: { "x-request-id": id } });
        await client.waitFor((t) => t.includes("\r\n\r\n"), 5000);
        client.socket.pause();
        const stoppedAt = Date.now();
        await expectReleased(rig, 5000 + STALL_MS + SLACK_MS);
        const releasedMs = Date.now() - stoppedAt;
        clearInterval(sampler);
        await until(
          "the engine's streams closed",
          async () => fat.requests.slice(sentBefore).filter((r) => r.closedEarly).length,
          (n) => n === k,
          2000,
        );
        const sent = fat.requests.slice(sentBefore).map((r) => r.bytesSent);
        const ids = k === 1 ? [id] : Array.from({ length: k }, (_, i) => `${id}/${i}`);
        await until(
          "log lines",
          async () => ids.every((x) => rig.requestLogs(x).length === 1),
          (ok) => ok,
          1000,
        );
        for (const x of ids) expect(rig.requestLogs(x)[0]).toMatchObject({ status: 499, outcome: "stalled" });
        client.leave();
        return { releasedMs, growthKb: peakKb - before.rssKb, sent };
      };
      const one = await stuck(1);
      const batch = await stuck(2);
      console.info(
        `[b1d] one stream: released ${one.releasedMs} ms, RSS +${one.growthKb} kB, engine sent ${one.sent.map((b) => b >> 20)} MB; ` +
          `batch of 2: released ${batch.releasedMs} ms, RSS +${batch.growthKb} kB, engine sent ${batch.sent.map((b) => b >> 20)} MB (of ${total >> 20} MB each)`,
      );
      // backpressure end to end: no prompt's stream was read to its end for a client that reads nothing
      for (const b of [...one.sent, ...batch.sent]) expect(b).toBeLessThan(total / 2);
      // before the fix the batch made the isolate buffer every byte of every prompt (+30 MB for 2 prompts)
      expect(batch.growthKb).toBeLessThan(2 * Math.max(one.growthKb, 4096) + 8192);
    } finally {
      await rig.putDocument(doc);
    }
  });
});

describe(`4. a batch has at most ${MAX_BATCH_PROMPTS} prompts, and counts as its prompts`, () => {
  const requestsTotal = async (status: number) =>
    Number(new RegExp(`pd_router_requests_total\\{route="/v1/completions",status="${status}"\\} (\\d+)`).exec(await rig.metrics())?.[1] ?? 0);

  it(`${MAX_BATCH_PROMPTS + 1} prompts: 400 naming 'prompt', nothing sent upstream`, async () => {
    const before = await rig.engineStats();
    const res = await request(rig.url, { path: "/v1/completions", body: batchBody(MAX_BATCH_PROMPTS + 1, { stream: false, max_tokens: 2 }) });
    expect(res.status).toBe(400);
    const error = JSON.parse(res.body).error;
    expect(error).toMatchObject({ type: "invalid_request_error", param: "prompt" });
    expect(error.message).toContain(String(MAX_BATCH_PROMPTS));
    const after = await rig.engineStats();
    expect(after.p0!.requests.total).toBe(before.p0!.requests.total);
    expect(after.d0!.requests.total).toBe(before.d0!.requests.total);
  });

  it(`${MAX_BATCH_PROMPTS} prompts: answered, and counted as ${MAX_BATCH_PROMPTS} requests in the metrics`, async () => {
    const before = await requestsTotal(200);
    const res = await request(rig.url, { path: "/v1/completions", body: batchBody(MAX_BATCH_PROMPTS, { stream: false, max_tokens: 2 }) });
    expect(res.status).toBe(200);
    expect(JSON.parse(res.body).choices).toHaveLength(MAX_BATCH_PROMPTS);
    await until(
      "the batch counted",
      () => requestsTotal(200),
      (n) => n >= before + MAX_BATCH_PROMPTS,
      3000,
    );
    expect(await requestsTotal(200)).toBe(before + MAX_BATCH_PROMPTS);
    await expectReleased(rig, 2000);
  });

  it(`the rate limiter counts a batch as its prompts: ${RATE_LIMIT} a minute is three batches of ${MAX_BATCH_PROMPTS}, and the refused one sends nothing`, async () => {
    const ip = `198.51.100.${1 + Math.floor(random() * 250)}`;
    let limited: { status: number; body: string; headers: Record<string, unknown> } | null = null;
    let answered = 0;
    let upstreamBefore = 0;
    // ceil(40 / 16) = 3 batches; twice that should the limiter's fixed window turn over once
    for (let i = 0; i < 6 && !limited; i++) {
      upstreamBefore = (await rig.engineStats()).p0!.requests.total;
      const res = await request(rig.url, {
        path: "/v1/completions",
        body: batchBody(MAX_BATCH_PROMPTS, { stream: false, max_tokens: 1 }),
        headers: { "cf-connecting-ip": ip },
      });
      if (res.status === 429) limited = res;
      else {
        expect(res.status, res.body).toBe(200);
        answered++;
      }
    }
    expect(limited, `${answered} batches of ${MAX_BATCH_PROMPTS} answered, none refused`).not.toBeNull();
    expect(JSON.parse(limited!.body).error).toMatchObject({ type: "rate_limit_error", code: "rate_limit_exceeded" });
    expect(limited!.headers["retry-after"]).toBe(String(RATE_PERIOD_S));
    expect((await rig.engineStats()).p0!.requests.total).toBe(upstreamBefore);
    // a client of its own address is not limited by it
    const other = await request(rig.url, { path: "/v1/completions", body: batchBody(2, { stream: false, max_tokens: 1 }), headers: { "cf-connecting-ip": "203.0.113.9" } });
    expect(other.status).toBe(200);
    await expectReleased(rig, 2000);
  });
});
