// Over real TCP against the Worker in workerd: a Responses stream's preamble is held until D's
// first output (vLLM yields `response.created` and `response.in_progress` before it reads the
// result generator: responses/serving.py `responses_stream_generator`; the router holds them so
// the status line waits for D's work, decode-source.ts `readFirstEvent`). A client that leaves
// while they are held — a user who closes the tab while a slow D pulls KV or queues — must end
// the request exactly once: D's connection closed, the lease released, one `aborted` log line,
// nothing charged to D. Modelled: the simulated vLLM decode node sends its preamble at once and
// its first output `decodeBaseMs` later (a D whose first step waits behind a queue or a pull).
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { RawClient, expectEnginesIdle, expectOneLogLine, expectReleased, sleep, startPairRig, until, type Rig } from "./lifecycle-harness";

const STALL_MS = 1000;
const SLACK_MS = 1500;
/** D's decode step (its first output comes this long after its preamble, far past the client's departure) */
const STEP_MS = 2500;

let rig: Rig;

beforeAll(async () => {
  ({ rig } = await startPairRig({
    vars: { LEASE_TTL_MS: 1500, CLIENT_STALL_MS: STALL_MS },
    document: { timeouts: { prefillMs: 3000, decodeFirstByteMs: 8000, decodeIdleMs: 8000, nonStreamMs: 8000 } },
  }));
  rig.engine("d0").setOptions({ decodeBaseMs: STEP_MS });
}, 120000);

afterAll(async () => {
  await rig?.stop();
});

beforeEach(async () => {
  await rig.reset();
});

let n = 0;

describe("a client that leaves while the router holds D's Responses preamble", () => {
  it.each([
    ["reset", "closes the tab (RST: request.signal fires at once): released at once", 0],
    // a FIN is a half-close HTTP/1.1 allows a client that still reads: workerd sees it only when a
    // write to the socket fails (docs/testing.md, "Clients that leave"): the first write after D's
    // first output goes into the socket, the client's kernel answers it with a reset, the next fails
    ["fin", "closes the socket in order (FIN only): released once a write of D's first outputs fails", 2 * STEP_MS],
  ] as const)("%s — %s; D's connection closed, one aborted log line, D not blamed", async (how, _what, seenAfterMs) => {
    const id = `lcp-${how}-${Date.now().toString(36)}-${n++}`;
    const failuresBefore = (await rig.adminStatus()).nodes.find((x) => x.id === "d0")!.failuresTotal;
    const client = new RawClient(rig.port, {
      path: "/v1/responses",
      body: { model: "sim-model", input: "Summarise the repository", stream: true, max_output_tokens: 50 },
      headers: { "x-request-id": id },
    });
    await until(
      "P answered, D streaming its preamble",
      () => rig.engineStats(),
      (s) => s.p0!.requests.vllmPrefill === 1 && s.p0!.inflight === 0 && s.d0!.inflight === 1,
      5000,
    );
    // D's preamble is out (it goes as the request arrives); its first output is seconds away
    await sleep(300);
    // held: nothing reached the client, not even the status line
    expect(client.bytes).toBe(0);
    client.leave(how);
    const ms = await expectReleased(rig, seenAfterMs + STALL_MS + SLACK_MS);
    const stats = await expectEnginesIdle(rig, 1000);
    // the router hung up on D: D did not finish an answer for nobody
    expect(stats.d0!.clientAborts).toBe(1);
    expect(stats.d0!.outputTokens).toBeLessThan(50);
    if (how === "reset") {
      // seen while the preamble was held, not at D's first output (a hold deaf to the client's
      // departure would end only when that output's write failed)
      expect(ms).toBeLessThan(STEP_MS - 500);
      expect(stats.d0!.outputTokens).toBe(0);
    }
    expect(await expectOneLogLine(rig, id)).toMatchObject({ status: 499, outcome: "aborted" });
    const d0 = (await rig.adminStatus()).nodes.find((x) => x.id === "d0")!;
    expect(d0.failuresTotal).toBe(failuresBefore);
    expect(d0.healthy).toBe(true);
    console.info(`[preamble ${how}] released ${ms} ms after the client left`);
  });
});
