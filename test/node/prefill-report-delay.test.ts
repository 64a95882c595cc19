// P's good answer travels with the request's finish report when the request ends within
// PREFILL_REPORT_DELAY_MS (one state call instead of two), so P's in-flight prefill count lags its
// answer by at most that much. The benchmark scales the delay with its simulated time (at time
// scale 0.05 the production 250 ms would count a finished prefill as running for 5 simulated s),
// so the var must do what it says: 0 reports P's answer at once, a long delay holds it until the
// request ends. Each case streams a long answer from D and looks at P while D still streams, and
// reads the request's log line: after the response began, P's report was a state call of its own
// (0) or travelled with the finish report (a long delay).
import { afterEach, describe, expect, it } from "vitest";

import { PREFILL_REPORT_DELAY_MS as BENCH_DEFAULT } from "../../bench/lib/harness.mjs";
import { PREFILL_REPORT_DELAY_MS } from "../../src/forward/lifecycle";

import { RawClient, chatBody, expectReleased, startPairRig, until, type Rig } from "./lifecycle-harness";

let rig: Rig | undefined;
afterEach(async () => {
  await rig?.stop();
  rig = undefined;
});

const p0 = async (r: Rig) => (await r.adminStatus()).nodes.find((n) => n.id === "p0")!.inflight;

/** A stream from D of 2,000 tokens at 5 ms a step: 10 s, while the test looks at P. */
async function streaming(r: Rig, requestId: string): Promise<RawClient> {
  const client = new RawClient(r.port, { body: chatBody({ stream: true, max_tokens: 2000 }), headers: { "x-request-id": requestId } });
  const started = await client.waitFor((t) => (t.match(/"content":"/g)?.length ?? 0) >= 2, 10_000);
  expect(started, client.text().slice(0, 300)).toBe(true);
  return client;
}

/** A request whose answer comes about 10 ms after P's: well within the default 250 ms delay. */
async function short(r: Rig, requestId: string): Promise<void> {
  const res = await fetch(`${r.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", "x-request-id": requestId },
    body: JSON.stringify(chatBody({ max_tokens: 1 })),
  });
  expect(res.status).toBe(200);
  await res.arrayBuffer();
}

/** The state calls the request made after its response began (its log line, once written). */
async function callsAfterResponse(r: Rig, requestId: string): Promise<number> {
  await until(
    "the request's log line",
    async () => r.requestLogs(requestId).length,
    (n) => n > 0,
    10_000,
  );
  const [line] = r.requestLogs(requestId);
  return Number(line!.stateCalls) - Number(line!.stateCallsBeforeResponse);
}

describe("PREFILL_REPORT_DELAY_MS", () => {
  it("the benchmark scales the Worker's own default", () => {
    expect(BENCH_DEFAULT).toBe(PREFILL_REPORT_DELAY_MS);
  });

  it("0: P's answer is reported at once, so P counts no prefill while D still streams", async () => {
    ({ rig } = await startPairRig({ engineDefaults: { decodeBaseMs: 5, decodeMsPerSeq: 0 }, vars: { PREFILL_REPORT_DELAY_MS: 0 } }));
    const client = await streaming(rig, "report-at-once");
    await until(
      "p0's prefill released",
      () => p0(rig!),
      (f) => f.prefill === 0,
      5_000,
    );
    // D is still streaming: the release came from P's own report, not the request's end
    expect(client.closed).toBe(false);
    expect((await rig.adminStatus()).leases).toBe(1);
    client.socket.destroy();
    await expectReleased(rig, 10_000);
    // P's report, then the finish report
    expect(await callsAfterResponse(rig, "report-at-once")).toBe(2);
    // so even a request that ends within the default delay reports P on its own (with the var
    // ignored, its P would travel with the finish report: one call)
    await short(rig, "short-at-once");
    expect(await callsAfterResponse(rig, "short-at-once")).toBe(2);
  }, 60_000);

  it("a delay longer than the request: P's prefill stays counted until the request ends, then both go", async () => {
    ({ rig } = await startPairRig({ engineDefaults: { decodeBaseMs: 5, decodeMsPerSeq: 0 }, vars: { PREFILL_REPORT_DELAY_MS: 600_000 } }));
    const client = await streaming(rig, "report-held");
    // D's tokens reach the client, so P has answered; a second later (four times the default
    // delay, D streaming for 10 s) its report still waits for the finish report
    await new Promise((r) => setTimeout(r, 1_000));
    expect(client.closed).toBe(false);
    expect((await p0(rig)).prefill).toBe(1);
    client.socket.destroy();
    await expectReleased(rig, 10_000);
    // P's report travelled with the finish report: one call
    expect(await callsAfterResponse(rig, "report-held")).toBe(1);
  }, 60_000);
});
