import { runDurableObjectAlarm } from "cloudflare:test";
import { beforeEach, describe, expect, it } from "vitest";
import { ALT_KEY, KEY } from "./ops-helpers";
import { chatBody, engineRequests, kv, post, putNodes, queued, resetEngines, resetState, setMetrics, snapshot, stub, useSignalsRig, waitFor } from "./signals-helpers";

useSignalsRig();

// Fair share across API keys at the edge (SPEC 9): among requests of one tier waiting for a
// decode node, the keys take turns, so one key flooding the queue delays another key's requests
// by at most its own turn; over its share of a full queue while others wait, a key gets 429.
// Runs in worker-secured: API_KEYS is set there (vitest.config.ts).

const PD = [
  { id: "p0", role: "prefill" as const },
  { id: "d0", role: "decode" as const },
  { id: "d1", role: "decode" as const },
];
const FLEX_KEY = "ops-key-flex";

const idOf = (r: { headers: Record<string, string> }) => r.headers["x-request-id"]?.split("-").slice(0, 2).join("-");
const decodeOrder = async () => (await engineRequests("d0")).filter((r) => r.path === "/v1/chat/completions").map(idOf);
const headers = (key: string, id: string) => ({ "content-type": "application/json", authorization: `Bearer ${key}`, "x-request-id": id });
/** ~34 tokens: d0 at 0.7 of 200 tokens takes one at a time */
const send = (key: string, id: string, extra: Record<string, unknown> = {}) =>
  post("/v1/chat/completions", chatBody(`${id} ${"x".repeat(120)}`, extra), { headers: headers(key, id) });

/** Hands the document to the object (a dry run, with a key), then runs its alarm: a poll of every node. */
async function poll(): Promise<void> {
  await (await post("/v1/route", chatBody("sync"), { headers: headers(KEY, "sync") })).arrayBuffer();
  await runDurableObjectAlarm(stub() as never);
}

/** Every decode node busy, under the document's `extra` fields, and the object told so. */
async function allBusy(extra: Record<string, unknown> = {}): Promise<void> {
  await setMetrics("d0", kv(0.95));
  await setMetrics("d1", kv(0.97));
  await putNodes(PD, extra);
  await poll();
}

/** Every decode node busy, then `flood` requests of key A and two of key B queued in that order. */
async function flood(extra: Record<string, unknown>, floodBy = 6): Promise<Array<Promise<Response>>> {
  await allBusy(extra);
  const answers: Array<Promise<Response>> = [];
  for (const [key, id] of [...Array.from({ length: floodBy }, (_, i) => [KEY, `fair-a${i}`]), [ALT_KEY, "fair-b0"], [ALT_KEY, "fair-b1"]] as const) {
    answers.push(send(key, id));
    await waitFor(`${id} queued`, queued, (n) => n === answers.length);
  }
  return answers;
}

async function releaseAll(answers: Array<Promise<Response>>): Promise<void> {
  await setMetrics("d0", kv(0.7, { capacityTokens: 200 }));
  await poll();
  for (const res of await Promise.all(answers)) {
    expect(res.status, await res.clone().text()).toBe(200);
    await res.arrayBuffer();
  }
}

beforeEach(async () => {
  await resetState();
  await resetEngines();
  for (const id of ["p0", "d0", "d1", "c0"]) await setMetrics(id, kv(0.1));
});

describe("fair share across API keys", () => {
  it("one key flooding the queue does not hold back another key's requests beyond a turn each", async () => {
    await releaseAll(await flood({}));
    expect(await decodeOrder()).toEqual(["fair-a0", "fair-b0", "fair-a1", "fair-b1", "fair-a2", "fair-a3", "fair-a4", "fair-a5"]);
  });

  it("a key whose queued requests' clients left gets those turns back", async () => {
    await allBusy();
    const leaving = new AbortController();
    const left = ["back-a0", "back-a1"].map((id) =>
      post("/v1/chat/completions", chatBody(`${id} ${"x".repeat(120)}`), { headers: headers(KEY, id), signal: leaving.signal }).catch((e: unknown) => e),
    );
    await waitFor("A's two queued", queued, (n) => n === 2);
    const answers = [send(ALT_KEY, "back-b0")];
    await waitFor("b0 queued", queued, (n) => n === 3);
    leaving.abort();
    await Promise.all(left);
    await waitFor("A's two left", queued, (n) => n === 1);
    answers.push(send(KEY, "back-a2"));
    await waitFor("a2 queued", queued, (n) => n === 2);
    answers.push(send(ALT_KEY, "back-b1"));
    await waitFor("b1 queued", queued, (n) => n === 3);
    await releaseAll(answers);
    // A's turns were never used: a2 is its first, level with b0 and ahead of B's second
    expect(await decodeOrder()).toEqual(["back-b0", "back-a2", "back-b1"]);
  });

  it('admission.fairShare "none": arrival order, the flood first', async () => {
    await releaseAll(await flood({ admission: { fairShare: "none" } }));
    expect(await decodeOrder()).toEqual(["fair-a0", "fair-a1", "fair-a2", "fair-a3", "fair-a4", "fair-a5", "fair-b0", "fair-b1"]);
  });

  it("a key over its share of a full queue while another waits: 429 fair_share_exceeded with retry-after", async () => {
    await allBusy({ admission: { maxQueued: 2 } });
    const a0 = send(KEY, "share-a0");
    await waitFor("a0 queued", queued, (n) => n === 1);
    const a1 = send(KEY, "share-a1");
    await waitFor("a1 queued", queued, (n) => n === 2);
    // the queue is full of A's: B's first takes the place of A's last
    const b0 = send(ALT_KEY, "share-b0");
    const pushedOut = await a1;
    expect(pushedOut.status).toBe(429);
    expect(pushedOut.headers.get("retry-after")).toMatch(/^[1-9]\d*$/);
    expect(((await pushedOut.json()) as { error: { code: string } }).error.code).toBe("fair_share_exceeded");
    // A holds its share (one of two) while B waits: refused at once
    const refused = await send(KEY, "share-a2");
    expect(refused.status).toBe(429);
    await refused.arrayBuffer();
    expect(await queued()).toBe(2);
    const rejected = (await snapshot()).admission.rejected.find((r) => r.reason === "fair_share_exceeded" && r.tier === "default");
    expect(rejected?.count).toBe(2);
    await releaseAll([a0, b0]);
    expect(await decodeOrder()).toEqual(["share-a0", "share-b0"]);
  });
});

describe("an API key with a service tier (API_KEYS entry key:tier)", () => {
  it("authenticates with the key alone, and caps what its requests may ask for", async () => {
    await putNodes([
      { id: "p0", role: "prefill" },
      { id: "d0", role: "decode", priorityScheduling: true },
    ] as never);
    const written = await send(`${FLEX_KEY}:flex`, "tier-written");
    expect(written.status).toBe(401);
    await written.arrayBuffer();
    for (const [key, id] of [
      [FLEX_KEY, "tier-capped"],
      [KEY, "tier-free"],
    ] as const) {
      const res = await send(key, id, { service_tier: "priority" });
      expect(res.status, await res.clone().text()).toBe(200);
      await res.arrayBuffer();
    }
    const bodies = (await engineRequests("d0")).map((r) => [idOf(r), (JSON.parse(r.body) as { priority?: number }).priority]);
    // the flex key's request asked for priority and got flex (vLLM priority 1); a key without a tier caps nothing (-1)
    expect(bodies).toEqual([
      ["tier-capped", 1],
      ["tier-free", -1],
    ]);
  });
});
