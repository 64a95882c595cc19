// The decode KV projection under the await protocol (vllm: D gets its leg once P answered), over
// real TCP against the Worker in workerd, with the router's own poll of the simulated engines'
// /metrics every second. The Worker test of the same accounting (test/worker/signals-guard.test.ts)
// runs the object's alarm by hand and ends the request with an in-process abort; here the poll is
// the object's own alarm and the client leaves with a reset, as a closed tab does.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RawClient, chatBody, expectReleased, startPairRig, until, type Rig } from "./lifecycle-harness";

let rig: Rig;

beforeAll(async () => {
  // p0 and d0 under vllm (the await protocol), the object polling the engines every second
  ({ rig } = await startPairRig({ document: { signals: { intervalMs: 1000 } } }));
}, 120000);

afterAll(async () => {
  await rig?.stop();
});

interface Signals {
  kvUsage: number;
  kvCapacityTokens: number;
  at: number;
  projected: { kvUsage: number } | null;
}
const d0Signals = async (): Promise<Signals | null> => ((await rig.adminStatus()).nodes.find((n) => n.id === "d0") as unknown as { signals: Signals | null }).signals;

describe("the KV projection under the await protocol, over real TCP", () => {
  it("a request whose P has not answered still counts on D after D's engine is polled without it; the client leaving (reset) frees exactly that", async () => {
    await until("d0 polled", d0Signals, (s) => s !== null && s.projected !== null, 10000);
    // P holds the request (a prefill stuck in a long queue): D's engine will not see it before P answers
    rig.engine("p0").setFault({ mode: "hang", count: 1 });
    const client = new RawClient(rig.port, { body: chatBody({ messages: [{ role: "user", content: "x".repeat(16_000) }] }) });
    await until(
      "routed, P holding it",
      () => rig.adminStatus(),
      (s) => s.nodes.find((n) => n.id === "d0")!.inflight.decode === 1,
      10000,
    );
    const routedAt = Date.now();
    // the object's own poll of d0 after the request was routed: d0's engine reports no such request
    const { value: polled } = await until("a poll of d0 after routing", d0Signals, (s) => s !== null && s.at > routedAt + 100, 10000);
    expect((await rig.engineStats()).d0!.inflight).toBe(0);
    // ~4,000 prompt tokens of the engine's capacity: still projected on D, over the reading
    const share = polled!.projected!.kvUsage - polled!.kvUsage;
    expect(share).toBeGreaterThan((0.5 * 4000) / polled!.kvCapacityTokens);
    expect(share).toBeLessThan((2 * 4000) / polled!.kvCapacityTokens);

    client.leave("reset");
    await expectReleased(rig, 10000);
    const after = (await d0Signals())!;
    expect(after.projected!.kvUsage).toBeCloseTo(after.kvUsage, 6);
  }, 60000);
});
