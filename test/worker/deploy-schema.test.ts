// Issue 18 items 1-3, the pure parts: how the document names a node's reach and bootstrap host,
// a busy node's retry-after, the DP ranks of a Mooncake /query answer.
import { describe, expect, it } from "vitest";
import { parseClusterDocument } from "../../src/config/schema";
import { nodeAccess } from "../../src/forward/node-fetch";
import { BUSY_RETRY_MAX_MS, retryAfterMs } from "../../src/forward/upstream";
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
  ] as const)("%j -> %s ms", (value, ms) => {
    expect(retryAfterMs(value)).toBe(ms);
  });
  it("an HTTP-date counts from now", () => {
    const now = Date.parse("2026-05-01T10:00:00Z");
    expect(retryAfterMs("Fri, 01 May 2026 10:00:05 GMT", now)).toBe(5000);
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
