// A vLLM P's handle must not be lost when the request ends while P's JSON answer is in transit,
// over real TCP against the Worker in workerd and the simulator's strict vLLM engines. vLLM answers
// a non-streamed request only once the prefill is done, so once P's headers arrived P holds the
// handle's blocks (vllm nixl/scheduler.py request_finished: delay_free_blocks until a D reads
// them or VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480 s). A request that ends then — a batch abandoned
// because another prompt failed, a client gone — used to abort the read of P's body: the handle
// was lost and P held the blocks to its timeout (seen in lifecycle-batch.test.ts with tiny
// prompts: 2 handles held). Now the body is read to its end in the background, within prefillMs,
// and the handle released (a D rejects a request carrying it: vLLM >= 0.21 tells P) — without
// holding the request's end: the client's answer and the log line come before P's body does.
//
// A small proxy in front of the simulated P makes the window wide: it passes P's headers at once
// and holds P's body until the test lets it go.
import http from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { expectReleased, request, sleep, startRig, until, type Rig } from "./lifecycle-harness";

/** P's whole answer, headers to body: bounds the background read of a body that never comes */
const PREFILL_MS = 6000;

let rig: Rig;
let proxy: http.Server;
/** the simulated P behind the proxy */
let target = "";
/** prompt 0's P answer reached the router's headers; its body waits for `letBodyGo` */
let headersSent: () => void = () => undefined;
let headersSentP: Promise<void> = Promise.resolve();
let letBodyGo: () => void = () => undefined;
let bodyGate: Promise<void> = Promise.resolve();
/** the router closed P's connection before the held body went out */
let bodyCut = false;

function armGates() {
  headersSentP = new Promise((resolve) => {
    headersSent = resolve;
  });
  bodyGate = new Promise((resolve) => {
    letBodyGo = resolve;
  });
  bodyCut = false;
}

beforeAll(async () => {
  proxy = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", async () => {
      const body = Buffer.concat(chunks);
      const text = body.toString("utf8");
      if (text.includes("FAIL-THIS-PROMPT")) {
        // another prompt of the batch is refused (the client's fault: not retried), once prompt 0's P answer is under way
        await headersSentP;
        res.writeHead(400, { "content-type": "application/json" });
        return void res.end(JSON.stringify({ error: { message: "prompt refused", type: "BadRequestError", param: "prompt", code: 400 } }));
      }
      const hold = text.includes("HOLD-THIS-ANSWER");
      const out = http.request(`${target}${req.url}`, { method: req.method, headers: req.headers, agent: false }, (up) => {
        const parts: Buffer[] = [];
        up.on("data", (c: Buffer) => parts.push(c));
        up.on("end", async () => {
          // the simulated P answered whole (its handle now exists); the router gets the headers at once
          res.writeHead(up.statusCode ?? 502, up.headers);
          res.flushHeaders();
          if (hold) {
            res.on("close", () => {
              if (!res.writableFinished) bodyCut = true;
            });
            headersSent();
            await bodyGate;
          }
          if (!res.destroyed) res.end(Buffer.concat(parts));
        });
      });
      out.on("error", () => res.destroy());
      out.end(body);
    });
  });
  await new Promise<void>((resolve) => proxy.listen(0, "127.0.0.1", resolve));
  const proxyUrl = `http://127.0.0.1:${(proxy.address() as AddressInfo).port}`;
  rig = await startRig({
    engines: [
      { id: "p0", role: "prefill" },
      { id: "d0", role: "decode" },
    ],
    vars: { LEASE_TTL_MS: 3000, CLIENT_STALL_MS: 2000 },
    document: (url) => {
      target = url("p0");
      return {
        protocol: "vllm",
        policy: { prefill: "round_robin", decode: "round_robin" },
        timeouts: { prefillMs: PREFILL_MS, decodeFirstByteMs: 3000, decodeIdleMs: 3000, nonStreamMs: 3000 },
        nodes: [
          { id: "p0", url: proxyUrl, role: "prefill" },
          { id: "d0", url: url("d0"), role: "decode" },
        ],
      };
    },
  });
}, 120_000);

afterAll(async () => {
  letBodyGo();
  await rig?.stop();
  await new Promise<void>((resolve) => proxy?.close(() => resolve()));
});

type HandleStats = { heldHandles: number; releasedHandles: number; issuedHandles: number; expiredHandles: number };
const p0 = async () => (await rig.engineStats()).p0 as unknown as HandleStats;
const releasesAtD = async () =>
  ((await (await fetch(`${rig.cluster.controlUrl}/engines/d0/requests`)).json()) as Array<{ body: string }>).filter((r) => r.body.includes("pd-edge-router-release")).length;

describe("the request ends while P's JSON answer is in transit: the handle is read out and released, not lost", () => {
  it("a batch abandoned when another prompt fails: the client's 400 and the log lines come first, then P's body is read and its handle released", async () => {
    await rig.reset();
    armGates();
    const before = await p0();
    const id = `pht-batch-${Date.now().toString(36)}`;
    const answer = request(rig.url, {
      path: "/v1/completions",
      body: { model: "sim-model", prompt: ["HOLD-THIS-ANSWER once upon a time", "FAIL-THIS-PROMPT please"], max_tokens: 4 },
      headers: { "x-request-id": id },
    });
    // the request ends (the other prompt's 400) while P's body is held back: nothing waits for it
    const res = await answer;
    expect(res.status).toBe(400);
    await until(
      "both prompts logged",
      async () => [0, 1].filter((i) => rig.requestLogs(`${id}/${i}`).length > 0).length,
      (n) => n === 2,
      3000,
    );
    expect(rig.requestLogs(`${id}/0`)[0]).toMatchObject({ status: 400, error: "another prompt of the batch failed" });
    // P made the handle when it answered, and holds its blocks
    const during = await p0();
    expect(during.issuedHandles).toBe(before.issuedHandles + 1);
    expect(during.heldHandles).toBe(1);
    // the router still reads P's answer
    await sleep(200);
    expect(bodyCut).toBe(false);
    letBodyGo();
    const after = await until("P's handle released", p0, (s) => s.heldHandles === 0, 5000);
    expect(after.value.releasedHandles).toBe(before.releasedHandles + 1);
    expect(after.value.expiredHandles).toBe(before.expiredHandles);
    expect(bodyCut).toBe(false);
    expect(await releasesAtD()).toBe(1);
    await expectReleased(rig, 3000);
  });

  it("P's body never comes (P's host lost mid-answer): the background read ends at prefillMs and nothing is released twice or held by the router", async () => {
    await rig.reset();
    armGates();
    const id = `pht-lost-${Date.now().toString(36)}`;
    const res = await request(rig.url, {
      path: "/v1/completions",
      body: { model: "sim-model", prompt: ["HOLD-THIS-ANSWER never sent", "FAIL-THIS-PROMPT again"], max_tokens: 4 },
      headers: { "x-request-id": id },
    });
    expect(res.status).toBe(400);
    await headersSentP;
    // the leg keeps only its deadline: the router hangs up on P at prefillMs, counting nothing against it
    await until(
      "the router gave up P's body",
      async () => bodyCut,
      (cut) => cut,
      PREFILL_MS + 5000,
    );
    expect((await p0()).releasedHandles).toBe(0);
    expect(await releasesAtD()).toBe(0);
    await expectReleased(rig, 3000);
    letBodyGo();
  }, 30_000);
});
