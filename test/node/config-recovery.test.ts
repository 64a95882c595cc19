// A new isolate that meets an invalid cluster document serves the last valid one, which the
// Durable Object kept (docs/operations.md, "The cluster document"). Over TCP: the Worker in workerd is
// stopped and started again on the same state (KV, Durable Object storage) — a new isolate, as
// after a deploy or an eviction — with an invalid document written to KV meanwhile.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { chatBody, request, startRig, until, type Rig } from "./lifecycle-harness";

let rig: Rig;
let valid: unknown;

beforeAll(async () => {
  rig = await startRig({
    engines: [
      { id: "p0", role: "prefill" },
      { id: "d0", role: "decode" },
    ],
    document: (url) =>
      (valid = {
        protocol: "vllm",
        nodes: [
          { id: "p0", url: url("p0"), role: "prefill" },
          { id: "d0", url: url("d0"), role: "decode" },
        ],
      }),
  });
}, 120000);

afterAll(async () => {
  await rig?.stop();
});

/** The request's log line, once it is written. */
const logOf = async (id: string) =>
  (
    await until(
      `log line of ${id}`,
      async () => rig.requestLogs(id),
      (l) => l.length === 1,
      5000,
    )
  ).value[0]!;

/** The config series of /metrics. */
async function configSeries() {
  const text = await rig.metrics();
  const value = (name: string) => Number(new RegExp(`^${name} (\\S+)$`, "m").exec(text)?.[1]);
  return { valid: value("pd_router_config_valid"), stale: value("pd_router_config_stale"), serving: value("pd_router_config_serving") };
}

describe("a new isolate recovers the last valid document from the Durable Object", () => {
  it("serves it while KV holds an invalid one, and says the document is stale", async () => {
    // the first request on the document: the isolate hands it to the object as the last valid one
    const first = await request(rig.url, { body: chatBody(), headers: { "x-request-id": "recovery-first" } });
    expect(first.status).toBe(200);
    // (saved, then routed twice: the object had no view of this document yet)
    expect((await logOf("recovery-first")).stateCallsBeforeResponse).toBe(3);

    // KV now holds a document that is not valid (a wrangler kv put, not the admin API, which refuses it)
    await rig.restart(JSON.stringify({ nodes: [{ id: "p0", url: "ftp://10.0.0.1", role: "prefill" }] }));
    const after = await request(rig.url, { body: chatBody(), headers: { "x-request-id": "recovery-after" } });
    expect(after.status, after.body).toBe(200);
    expect([after.headers["x-pd-prefill"], after.headers["x-pd-decode"]]).toEqual(["p0", "d0"]);
    // the new isolate read the last valid document back from the object, then routed once
    expect((await logOf("recovery-after")).stateCallsBeforeResponse).toBe(2);
    expect(await configSeries()).toEqual({ valid: 0, stale: 1, serving: 1 });
    expect((await rig.adminStatus()).serving.stale).toBe(true);
    expect(rig.lines().some((l) => l.includes('"event":"config_invalid"') && l.includes("nodes[0].url"))).toBe(true);

    // a valid document again, and nothing is stale
    await rig.putDocument(valid);
    expect((await request(rig.url, { body: chatBody() })).status).toBe(200);
    expect(await configSeries()).toEqual({ valid: 1, stale: 0, serving: 1 });
  });
});
