// Issue 25 item 1, over real TCP against the Worker in workerd: a client that leaves while D is
// streaming must leave nothing behind in the isolate. The runtime rejects a body read pending
// under an aborted fetch with an error that captures its async stack and keeps it; that stack's
// closures held the whole request (its life, its leg, the upstream text, the SSE reader): 4-8 KB
// per departure, and an isolate has 128 MB. Measured as V8 reports it through workerd's inspector,
// after forced collections.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
// @ts-expect-error plain JS module
import { devtoolsSession, heapAfterGc, heapObjectBytes } from "../../scripts/devtools.mjs";
import { RawClient, chatBody, expectEnginesIdle, expectReleased, startPairRig, type Rig } from "./lifecycle-harness";

/** One conversation throughout: the object's per-conversation memory (stickiness, prefix index) stays one entry, so what grows is what requests leave. */
const SAME_CONVERSATION = (max_tokens: number) => chatBody({ stream: true, max_tokens, messages: [{ role: "user", content: "the same question every time" }] });

let rig: Rig;

beforeAll(async () => {
  ({ rig } = await startPairRig({
    // D writes a token every 2 ms: a 400-token answer is still streaming when the client leaves
    engineDefaults: { decodeBaseMs: 2, decodeMsPerSeq: 0, transferInterferenceMs: 0, transferMsPerBlock: 0 },
    // workerd binds a free inspector port itself and names it (one picked here could be taken meanwhile)
    inspectorPort: 0,
  }));
}, 120000);

afterAll(async () => {
  await rig?.stop();
});

/** `count` clients, `concurrency` at a time, each leaving once D's first tokens reached it. */
async function leaveMidStream(count: number, concurrency: number): Promise<void> {
  let next = 0;
  const one = async () => {
    while (next < count) {
      next++;
      const client = new RawClient(rig.port, { body: SAME_CONVERSATION(400) });
      // a data event with content: D's stream is being relayed, its next read pending
      const streaming = await client.waitFor((t) => (t.match(/"content":"/g)?.length ?? 0) >= 2, 10_000);
      expect(streaming, client.text().slice(0, 300)).toBe(true);
      client.leave();
    }
  };
  await Promise.all(Array.from({ length: concurrency }, one));
  await expectReleased(rig, 15_000);
  await expectEnginesIdle(rig, 15_000);
}

describe("clients that leave mid-stream leave nothing behind in the isolate", () => {
  it("the JS objects on the heap after forced GC grow by under 256 bytes a departed request", async () => {
    const session = await devtoolsSession(rig.inspectorPort!);
    try {
      // warm: JIT (compiled code is heap too: what is left of it is spread over many departures
      // below), the Durable Object, connection pools
      await leaveMidStream(120, 6);
      const heapBefore = await heapAfterGc(session);
      const before = await heapObjectBytes(session);
      const departures = 200;
      await leaveMidStream(departures, 6);
      const heapAfter = await heapAfterGc(session);
      const after = await heapObjectBytes(session);
      const perRequest = (after.bytes - before.bytes) / departures;
      const grown = Object.entries(after.byType).map(([type, b]) => `${type} ${Math.round((b - (before.byType[type] ?? 0)) / departures)}`);
      console.info(
        `[memory] ${departures} departures: JS objects ${perRequest.toFixed(0)} B each (${grown.join(", ")}); whole heap incl. compiled code ${Math.round((heapAfter - heapBefore) / departures)} B each (target ${session.target.title ?? session.target.id})`,
      );
      expect(perRequest).toBeLessThan(256);
    } finally {
      session.close();
    }
  }, 180_000);
});
