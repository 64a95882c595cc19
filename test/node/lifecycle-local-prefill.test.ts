// Conditional disaggregation's local prefill over real TCP against the Worker in workerd (issue 17
// part 2): a request D prefills alone holds D's prefill work and its KV in one lease; whatever
// ends it — the client leaving while D still prefills, a D that fails before its first byte —
// the lease is released once, D's leg is closed and one log line says how it was served.
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { RawClient, expectEnginesIdle, expectOneLogLine, expectReleased, request, startRig, until, type Rig } from "./lifecycle-harness";
import { seededRandom } from "../support/seeded";

const STALL_MS = 1000;
const TIMEOUTS = { prefillMs: 3000, decodeFirstByteMs: 3000, decodeIdleMs: 800, nonStreamMs: 3000 };
const SLACK_MS = 1500;
const RUN = seededRandom(11)().toString(36).slice(2, 8);

let rig: Rig;

beforeAll(async () => {
  rig = await startRig({
    engines: [
      { id: "p0", role: "prefill" },
      { id: "d0", role: "decode" },
      { id: "d1", role: "decode" },
    ],
    vars: { CLIENT_STALL_MS: STALL_MS },
    document: (url) => ({
      protocol: "vllm",
      // affinity on a session id: every turn of a conversation meets the same D first
      policy: { prefill: "affinity", decode: "affinity", disaggregation: "conditional" },
      timeouts: TIMEOUTS,
      health: { ejectAfter: 100 },
      nodes: [
        { id: "p0", url: url("p0"), role: "prefill" },
        { id: "d0", url: url("d0"), role: "decode" },
        { id: "d1", url: url("d1"), role: "decode" },
      ],
    }),
  });
}, 120000);

afterAll(async () => {
  await rig?.stop();
});

beforeEach(async () => {
  await rig.reset();
});

let n = 0;
/** A conversation warm on its D: turn 1 went P then D, so turn 2 is prefilled by that D alone. */
async function warmConversation(): Promise<{ session: string; turn2: Record<string, unknown>; d: string }> {
  const session = `local-${RUN}-${n++}`;
  const system = `${session} handbook. `.padEnd(6 * 2048, "rule. ");
  const turn1 = {
    model: "sim-model",
    max_tokens: 2,
    messages: [
      { role: "system", content: system },
      { role: "user", content: "first" },
    ],
  };
  const one = await request(rig.url, { body: turn1, headers: { "x-session-id": session } });
  expect(one.status).toBe(200);
  expect(one.headers["x-pd-mode"]).toBe("disaggregated");
  const turn2 = { ...turn1, messages: [...turn1.messages, { role: "assistant", content: "a" }, { role: "user", content: "second" }], stream: true, max_tokens: 40 };
  await expectReleased(rig, SLACK_MS);
  return { session, turn2, d: String(one.headers["x-pd-decode"]) };
}

describe("a local prefill ends exactly once", () => {
  it("the client leaves while D prefills alone: D's leg is closed, the lease (prefill part included) released, one log line", async () => {
    const { session, turn2, d } = await warmConversation();
    rig.engine(d).setFault({ mode: "slow", delayMs: 1500, count: 1 });
    const id = `local-leave-${RUN}`;
    const client = new RawClient(rig.port, { body: turn2, headers: { "x-session-id": session, "x-request-id": id } });
    await client.connected;
    // D has the request (the status shows its prefill part and its stream on D), and P has nothing
    const during = await until(
      "local prefill in flight",
      () => rig.adminStatus(),
      (s) => (s.nodes.find((x) => x.id === d)?.inflight.prefill ?? 0) === 1,
      3000,
    );
    expect(during.value.nodes.find((x) => x.id === d)?.inflight.decode).toBe(1);
    expect(during.value.nodes.find((x) => x.id === "p0")?.inflight.prefill).toBe(0);
    client.leave();
    // seen at once through request.signal (RawClient.leave resets the socket): D's leg is closed mid-prefill
    await expectReleased(rig, STALL_MS + SLACK_MS);
    await expectEnginesIdle(rig, STALL_MS + SLACK_MS);
    const line = await expectOneLogLine(rig, id);
    expect(line).toMatchObject({ status: 499, outcome: "aborted", mode: "local", reason: "cached", prefill: d, decode: d });
  });

  it("D resets before its first byte: the request goes P then the other D, which never prefills the whole prompt alone (issue 25 item 5)", async () => {
    const { session, turn2, d } = await warmConversation();
    const other = d === "d0" ? "d1" : "d0";
    rig.engine(d).setFault({ mode: "reset", count: 1 });
    const prefillsBefore = (await rig.engineStats()).p0!.requests.total;
    const id = `local-failover-${RUN}`;
    const res = await request(rig.url, { body: turn2, headers: { "x-session-id": session, "x-request-id": id } });
    expect(res.status).toBe(200);
    expect(res.headers["x-pd-mode"]).toBe("disaggregated");
    expect(res.headers["x-pd-decode"]).toBe(other);
    expect(res.headers["x-pd-prefill"]).toBe("p0");
    expect(res.body.trimEnd().endsWith("data: [DONE]")).toBe(true);
    await expectReleased(rig, SLACK_MS);
    const line = await expectOneLogLine(rig, id);
    // the log says how it was served in the end, not the first D's prediction
    expect(line).toMatchObject({ status: 200, outcome: "ok", mode: "disaggregated", reason: "no_local_prefill", prefill: "p0", decode: other });
    expect(line.uncachedTokens).toBeUndefined();
    // P prefilled turn 2, and the other D got P's KV handle, not the prompt to compute alone
    expect((await rig.engineStats()).p0!.requests.total).toBe(prefillsBefore + 1);
    const atOther = (rig.engine(other).requests() as Array<{ headers: Record<string, string>; body: string }>).filter((r) => r.headers["x-request-id"]?.startsWith(id));
    expect(atOther).toHaveLength(1);
    expect(JSON.parse(atOther[0]!.body).kv_transfer_params).toBeTruthy();
  });
});
