import { beforeEach, describe, expect, it } from "vitest";
import { ADMISSION_RESERVATION_MS } from "../../src/state/cluster-state";
import {
  chatBody,
  engineFault,
  engineRequests,
  kv,
  poll,
  post,
  putNodes,
  queued,
  resetEngines,
  resetState,
  setMetrics,
  snapshot,
  stub,
  useSignalsRig,
  waitFor,
} from "./signals-helpers";

useSignalsRig();

// Admission at the edge (SPEC 8): when every decode node that could serve a request is busy, it
// waits in the pool's object, first come first served, holding nothing upstream.

const PD = [
  { id: "p0", role: "prefill" as const },
  { id: "d0", role: "decode" as const },
  { id: "d1", role: "decode" as const },
];

/** requests refused at the edge so far, by reason (the object's counters outlive a test) */
const rejected = async (reason: string) => (await snapshot()).admission.rejected.find((r) => r.reason === reason)?.count ?? 0;
const decodeLegs = async (id: string) => (await engineRequests(id)).filter((r) => r.path === "/v1/chat/completions");

beforeEach(async () => {
  await resetState();
  await resetEngines();
  for (const id of ["p0", "d0", "d1", "c0"]) await setMetrics(id, kv(0.1));
});

describe("every decode node busy", () => {
  it("requests wait, are admitted in arrival order one at a time as capacity frees, and say how long they waited", async () => {
    // d1 busy; d0 busy until its next poll
    await setMetrics("d1", kv(0.97));
    await setMetrics("d0", kv(0.95));
    await putNodes(PD);
    await poll();
    const first = new AbortController();
    const answers: Array<Promise<Response>> = [];
    for (const name of ["first", "second", "third"]) {
      // ~130 characters of prompt: ~34 tokens at the default 4 characters a token, 0.17 of d0's 200
      const body = chatBody(`${name} ${"x".repeat(120)}`);
      const init = { headers: { "content-type": "application/json", "x-request-id": `adm-${name}` }, ...(name === "first" ? { signal: first.signal } : {}) };
      answers.push(post("/v1/chat/completions", body, init));
      await waitFor(`${name} queued`, queued, (n) => n === answers.length);
    }
    expect(await decodeLegs("d0")).toHaveLength(0);
    expect((await snapshot()).leases).toBe(0);

    // d0's next poll shows room for one request at a time (0.7 of 200 tokens: 0.7 + 0.17 is under
    // kvBusy, 0.7 + 2 x 0.17 is not). The first one's D leg hangs, so it holds d0's room: the
    // other two must still be waiting (a guard that forgot the request's own tokens admits all three).
    await engineFault("d0", { mode: "hang", count: 1 });
    await setMetrics("d0", kv(0.7, { capacityTokens: 200 }));
    await poll();
    await waitFor(
      "the first reached d0",
      () => decodeLegs("d0"),
      (legs) => legs.length === 1,
    );
    const held = await snapshot();
    expect([held.admission.queued, held.leases]).toEqual([2, 1]);
    // its client leaves: its room frees, and the rest follow one by one, in order
    first.abort();
    await answers[0]!.catch(() => null);
    const done = await Promise.all(answers.slice(1));
    for (const res of done) {
      expect(res.status, await res.clone().text()).toBe(200);
      expect(res.headers.get("x-pd-decode")).toBe("d0");
      expect(res.headers.get("server-timing")).toMatch(/^queue;dur=\d+, route;dur=/);
      await res.arrayBuffer();
    }
    const order = (await decodeLegs("d0")).map((r) => r.headers["x-request-id"]?.split("-").slice(0, 2).join("-"));
    expect(order).toEqual(["adm-first", "adm-second", "adm-third"]);
    const s = await waitFor("released", snapshot, (x) => x.leases === 0 && x.admission.queued === 0);
    expect(s.admission.wait.count).toBeGreaterThanOrEqual(3);
  });

  it("a later request that would fit waits behind an earlier one that does not (first come, first served per pool)", async () => {
    await setMetrics("d1", kv(0.97));
    await setMetrics("d0", kv(0.7, { capacityTokens: 200 }));
    await putNodes(PD);
    await poll();
    // ~600 characters: ~150 tokens, 0.75 of d0's 200: never fits over 0.7 of it
    const large = post("/v1/chat/completions", chatBody(`large ${"x".repeat(600)}`), { headers: { "content-type": "application/json", "x-request-id": "fcfs-large" } });
    await waitFor("the large one queued", queued, (n) => n === 1);
    // ~34 tokens: d0 could take it now, but the large one came first
    const small = post("/v1/chat/completions", chatBody(`small ${"x".repeat(120)}`), { headers: { "content-type": "application/json", "x-request-id": "fcfs-small" } });
    await waitFor("the small one queued behind it", queued, (n) => n === 2);
    expect(await decodeLegs("d0")).toHaveLength(0);
    // /v1/route says so too: a request of that model would wait behind them
    const dry = (await (await post("/v1/route", chatBody(`dry ${"x".repeat(120)}`))).json()) as { admission: unknown };
    expect(dry.admission).toEqual({ wait: true, queued: 2 });
    // room for the large one but not for both (20 + 150 + 34 tokens over 0.9 of 200): it is
    // admitted first and the small one only once it is done, so the order d0 sees is the queue's
    // (with d0's capacity unknown both were admitted at once and raced through P: 2 of 9 runs
    // reached d0 small first)
    await setMetrics("d0", kv(0.1, { capacityTokens: 200 }));
    await poll();
    for (const res of await Promise.all([large, small])) {
      expect(res.status, await res.clone().text()).toBe(200);
      await res.arrayBuffer();
    }
    const order = (await decodeLegs("d0")).map((r) => r.headers["x-request-id"]?.split("-").slice(0, 2).join("-"));
    expect(order).toEqual(["fcfs-large", "fcfs-small"]);
  });

  it("503 cluster_busy with retry-after once admission.queueMs has passed, nothing sent upstream", async () => {
    await setMetrics("d0", kv(0.99));
    await setMetrics("d1", kv(0.99));
    await putNodes(PD, { admission: { queueMs: 300, maxQueued: 10 } });
    await poll();
    const timeouts = await rejected("timeout");
    const res = await post("/v1/chat/completions", chatBody("too late"));
    expect(res.status).toBe(503);
    expect(res.headers.get("retry-after")).toMatch(/^\d+$/);
    const body = (await res.json()) as { error: { code: string; type: string } };
    expect(body.error).toMatchObject({ code: "cluster_busy", type: "service_unavailable" });
    expect(await decodeLegs("d0")).toHaveLength(0);
    expect(await decodeLegs("d1")).toHaveLength(0);
    expect((await engineRequests("p0")).length).toBe(0);
    const s = await snapshot();
    expect(s.leases).toBe(0);
    expect(await rejected("timeout")).toBe(timeouts + 1);
  });

  it("a full queue answers 503 at once (admission.maxQueued)", async () => {
    await setMetrics("d0", kv(0.99));
    await setMetrics("d1", kv(0.99));
    await putNodes(PD, { admission: { queueMs: 600_000, maxQueued: 1 } });
    await poll();
    const full = await rejected("queue_full");
    const waiting = post("/v1/chat/completions", chatBody("waits"));
    await waitFor("one queued", queued, (n) => n === 1);
    const refused = await post("/v1/chat/completions", chatBody("refused"));
    expect(refused.status).toBe(503);
    expect(((await refused.json()) as { error: { code: string } }).error.code).toBe("cluster_busy");
    expect(await rejected("queue_full")).toBe(full + 1);
    // room again: the waiting one goes through
    await setMetrics("d1", kv(0.2));
    await poll();
    expect((await waiting).status).toBe(200);
  });

  it("/v1/route says a request would wait, and shows why", async () => {
    await setMetrics("d0", kv(0.99));
    await setMetrics("d1", kv(0.93));
    await putNodes(PD);
    await poll();
    const route = (await (await post("/v1/route", chatBody("dry"))).json()) as any;
    expect(route.admission).toEqual({ wait: true, queued: 0 });
    expect(route.candidates.decode.map((c: any) => [c.id, c.busy, c.kvUsage])).toEqual(
      expect.arrayContaining([
        ["d0", true, 0.99],
        ["d1", true, 0.93],
      ]),
    );
  });
});

describe("a client that leaves while queued", () => {
  it("leaves the queue at once (request.signal), holds no lease and opens no leg", async () => {
    await setMetrics("d0", kv(0.99));
    await setMetrics("d1", kv(0.99));
    await putNodes(PD);
    await poll();
    const client = new AbortController();
    const pending = post("/v1/chat/completions", chatBody("leaves"), {
      signal: client.signal,
      headers: { "content-type": "application/json", "x-request-id": "adm-leaver" },
    }).catch((e: unknown) => e);
    await waitFor("queued", queued, (n) => n === 1);
    client.abort();
    await pending;
    await waitFor("left the queue", queued, (n) => n === 0);
    // capacity frees: nobody is admitted for the client that left
    await setMetrics("d1", kv(0.2));
    await poll();
    const s = await snapshot();
    expect(s.leases).toBe(0);
    expect(s.nodes.every((n) => n.inflight.decode === 0 && n.inflight.prefill === 0)).toBe(true);
    expect((await engineRequests("p0")).length + (await decodeLegs("d0")).length + (await decodeLegs("d1")).length).toBe(0);
  });
});

describe("a Worker whose handler is gone when its request is admitted", () => {
  it("holds the lease only as a reservation: unconfirmed, it is released within ADMISSION_RESERVATION_MS", async () => {
    await setMetrics("d0", kv(0.99));
    await setMetrics("d1", kv(0.99));
    await putNodes(PD);
    await poll();
    const version = (await snapshot()).version!;
    // the route call a Worker makes; its handler is cancelled while it waits and never renews
    const called = Date.now();
    const routed = stub().route({ version, model: "sim-model", key: null, prefixHashes: [], tokens: 10, dryRun: false, leaseId: "reservation-1", route: "/v1/chat/completions" });
    await waitFor("queued", queued, (n) => n === 1);
    // it waits at least this long, whatever the machine's speed
    await new Promise((r) => setTimeout(r, 300));
    await setMetrics("d1", kv(0.2));
    await poll();
    const answer = await routed;
    const elapsed = Date.now() - called;
    if (!answer.ok) throw new Error(`not admitted: ${JSON.stringify(answer.error)}`);
    expect(answer.queuedMs).toBeGreaterThanOrEqual(300);
    expect(answer.queuedMs).toBeLessThanOrEqual(elapsed);
    expect((await snapshot()).leases).toBe(1);
    const s = await waitFor("reservation released", snapshot, (x) => x.leases === 0, ADMISSION_RESERVATION_MS + 3000);
    expect(s.nodes.find((n) => n.id === "d1")!.inflight.decode).toBe(0);
  }, 15000);
});
