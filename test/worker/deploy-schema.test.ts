// Issue 18 items 1-3, the pure parts: how the document names a node's reach and bootstrap host,
// a busy node's retry-after, the DP ranks of a Mooncake /query answer.
import { describe, expect, it } from "vitest";
import { parseClusterDocument } from "../../src/config/schema";
import { nodeAccess } from "../../src/config/node-access";
import { retryAfterMs, statusOutcome } from "../../src/forward/upstream";
import { BUSY_RETRY_MAX_MS, NodeHealthTable } from "../../src/state/health-table";
import { ranksOf } from "../../src/forward/vllm-mooncake";
import { withoutFileEngines } from "./helpers";

withoutFileEngines();

const doc = (node: Record<string, unknown>, extra: Record<string, unknown> = {}) => ({
  protocol: "colocated",
  ...extra,
  nodes: [{ id: "n", url: "http://10.0.0.1:8100", role: "both", ...node }],
});
const parsed = (d: unknown) => {
  const r = parseClusterDocument(d);
  if (!r.ok) throw new Error(JSON.stringify(r.problems));
  return r.config;
};
const problems = (d: unknown) => {
  const r = parseClusterDocument(d);
  return r.ok ? [] : r.problems.map((p) => p.path);
};

describe("bootstrapHost: the address decode nodes use, as it goes into a URL", () => {
  it.each([
    [{}, "10.0.0.1"],
    [{ url: "http://[fd00::7]:8100" }, "[fd00::7]"],
    [{ bootstrapHost: "fd00::1" }, "[fd00::1]"],
    [{ bootstrapHost: "[FD00::1]" }, "[fd00::1]"],
    [{ bootstrapHost: "p0.gpu.internal" }, "p0.gpu.internal"],
    [{ bootstrapHost: "192.168.3.4" }, "192.168.3.4"],
  ])("%j -> %s", (node, host) => {
    expect(parsed(doc(node)).nodes[0]!.bootstrapHost).toBe(host);
  });
  it.each(["http://p0", "p0:8998", "p0/x", "[fd00::1]:8998", "", "a b"])("%j is refused, naming the field", (bootstrapHost) => {
    expect(problems(doc({ bootstrapHost }))).toEqual(["nodes[0].bootstrapHost"]);
  });
});

describe("reach: the document's default, a node's own replaces it", () => {
  it("a node without `reach` takes the document's; `reach: {}` is direct", () => {
    const config = parsed({
      protocol: "colocated",
      reach: { binding: "VPC_GPU" },
      nodes: [
        { id: "a", url: "http://10.0.0.1:8100", role: "both" },
        { id: "b", url: "http://10.0.0.2:8100", role: "both", reach: {} },
        { id: "c", url: "https://c.example.com", role: "both", reach: { access: { clientId: "NODE_A_ID", clientSecret: "NODE_A_SECRET" } } },
      ],
    });
    expect(config.nodes.map((n) => n.reach)).toEqual([{ binding: "VPC_GPU" }, {}, { access: { clientId: "NODE_A_ID", clientSecret: "NODE_A_SECRET" } }]);
  });
  it("only VPC_* bindings and NODE_* secret names; unknown fields refused", () => {
    expect(problems(doc({ reach: { binding: "NODES" } }))).toEqual(["nodes[0].reach.binding"]);
    expect(problems(doc({}, { reach: { binding: "CLUSTER_STATE" } }))).toEqual(["reach.binding"]);
    // a client id pasted in place of the secret's name is caught
    expect(problems(doc({ reach: { access: { clientId: "88bf3b6d.access", clientSecret: "NODE_S" } } }))).toEqual(["nodes[0].reach.access.clientId"]);
    expect(problems(doc({ reach: { access: { clientId: "NODE_ID" } } }))).toEqual(["nodes[0].reach.access.clientSecret"]);
    expect(problems(doc({ reach: { via: "VPC_GPU" } }))).toEqual(["nodes[0].reach"]);
  });
});

describe("nodeAccess: what a node's requests carry", () => {
  const env = { VPC_GPU: { fetch: () => Promise.resolve(new Response("via")) }, NODE_ID: "id-1", NODE_SECRET: "secret-1", NODE_TOKEN: "t", NOT_A_BINDING: "text" };
  it("the Access headers and bearer only for a node that names them", () => {
    expect(nodeAccess(env, { id: "a", reach: { access: { clientId: "NODE_ID", clientSecret: "NODE_SECRET" } }, apiKeySecret: "NODE_TOKEN" }).headers).toEqual({
      authorization: "Bearer t",
      "cf-access-client-id": "id-1",
      "cf-access-client-secret": "secret-1",
    });
    expect(nodeAccess(env, { id: "b", reach: {} }).headers).toEqual({});
  });
  it("requests go through the binding's fetch; a name bound to something that is not a fetcher fails the node", async () => {
    expect(await (await nodeAccess(env, { id: "a", reach: { binding: "VPC_GPU" } }).fetch(new URL("http://10.0.0.1/x"), {})).text()).toBe("via");
    await expect(nodeAccess(env as Record<string, unknown>, { id: "b", reach: { binding: "NOT_A_BINDING" } }).fetch(new URL("http://10.0.0.1/x"), {})).rejects.toThrow(
      /NOT_A_BINDING is not bound/,
    );
  });
});

describe("retry-after of a busy node", () => {
  it.each([
    ["3", 3000],
    ["0", 0],
    [" 12 ", 12000],
    ["99999", BUSY_RETRY_MAX_MS],
    ["soon", null],
    [null, null],
    // not RFC 9110 forms, which a lenient date parser read as dates (issue 25 item 7)
    ["-5", null],
    ["+5", null],
    ["1.5", null],
    ["5 s", null],
  ] as const)("%j -> %s ms", (value, ms) => {
    expect(retryAfterMs(value)).toBe(ms);
  });
  it("an HTTP-date counts from now", () => {
    const now = Date.parse("2026-05-01T10:00:00Z");
    expect(retryAfterMs("Fri, 01 May 2026 10:00:05 GMT", now)).toBe(5000);
    // RFC 9110 5.6.7's obsolete forms, which a recipient must accept: RFC 850 and asctime
    expect(retryAfterMs("Friday, 01-May-26 10:00:07 GMT", now)).toBe(7000);
    expect(retryAfterMs("Fri May  1 10:00:09 2026", now)).toBe(9000);
    expect(retryAfterMs("2026-05-01T10:00:05Z", now)).toBeNull();
  });
});

describe("a busy node's window", () => {
  const settings = { intervalMs: 10_000, probeTimeoutMs: 2000, downAfter: 2, upAfter: 2, ejectAfter: 3, ejectBaseMs: 10_000, ejectMaxMs: 300_000 };
  it("closes when the node answers well: a 429 with retry-after 60 does not keep a node that serves out for a minute", () => {
    const t = new NodeHealthTable();
    t.sync(new Set(["d0"]));
    t.report({ node: "d0", outcome: "busy", retryAfterMs: 60_000 }, 1000, settings);
    expect(t.view("d0").busyUntil).toBe(61_000);
    t.report({ node: "d0", outcome: "ok" }, 2000, settings);
    expect(t.view("d0").busyUntil).toBe(0);
    expect(t.busyEnd(2000)).toBe(Number.POSITIVE_INFINITY);
  });
});

describe("a 503 from in front of the engine", () => {
  it("without retry-after is a node with no ready backend (a failure); with one, or the engine's own, is busy", () => {
    expect(statusOutcome(503, "front", false)).toBe("failure");
    expect(statusOutcome(503, "front", true)).toBe("busy");
    expect(statusOutcome(503, "engine", false)).toBe("busy");
    expect(statusOutcome(429, "front", false)).toBe("busy");
  });
});

describe("Mooncake /query: one engine id per DP rank", () => {
  it("ranks in order; a gap or an entry without an id gives nothing to use", () => {
    expect(ranksOf({ 0: { engine_id: "a" }, 1: { engine_id: "b" } })).toEqual(["a", "b"]);
    expect(ranksOf({ 1: { engine_id: "b" }, 0: { engine_id: "a" } })).toEqual(["a", "b"]);
    expect(ranksOf({ 0: { engine_id: "a" }, 2: { engine_id: "c" } })).toEqual([]);
    expect(ranksOf({ 0: {} })).toEqual([]);
    expect(ranksOf(null)).toEqual([]);
  });
});
