import { describe, expect, it } from "vitest";
import { ClusterConfigLoader, type ConfigSource } from "../../src/config/load";
import { parseClusterDocument } from "../../src/config/schema";
import { nodesPointingAt } from "../../src/config/self-origin";
import { withoutFileEngines } from "./helpers";

withoutFileEngines();

const p0 = { id: "p0", url: "http://10.0.0.1:8100", role: "prefill" };
const d0 = { id: "d0", url: "http://10.0.0.2:8200", role: "decode" };
const problems = (doc: unknown) => {
  const r = parseClusterDocument(doc);
  return r.ok ? [] : r.problems;
};
const paths = (doc: unknown) => problems(doc).map((p) => p.path);

describe("cluster document: timeouts (SPEC 2)", () => {
  it("has decodeIdleMs and nonStreamMs with their defaults, next to prefillMs and decodeFirstByteMs", () => {
    const r = parseClusterDocument({ nodes: [p0, d0] });
    expect(r.ok && r.config.timeouts).toEqual({ prefillMs: 120000, decodeFirstByteMs: 120000, decodeIdleMs: 120000, nonStreamMs: 3600000 });
  });
  it("accepts a non-streamed limit of hours, refuses absurd values naming the field", () => {
    expect(paths({ nodes: [p0, d0], timeouts: { nonStreamMs: 6 * 3600_000 } })).toEqual([]);
    expect(paths({ nodes: [p0, d0], timeouts: { nonStreamMs: 6 * 3600_000 + 1 } })).toEqual(["timeouts.nonStreamMs"]);
    expect(paths({ nodes: [p0, d0], timeouts: { decodeIdleMs: 600_001 } })).toEqual(["timeouts.decodeIdleMs"]);
    expect(paths({ nodes: [p0, d0], timeouts: { decodeIdleMs: 1 } })).toEqual(["timeouts.decodeIdleMs"]);
    expect(paths({ nodes: [p0, d0], timeouts: { idleMs: 5000 } })).toEqual(["timeouts"]);
  });
});

describe("cluster document: protocol vllm-mooncake", () => {
  it("is a protocol of its own", () => {
    const r = parseClusterDocument({ protocol: "vllm-mooncake", nodes: [p0, d0] });
    expect(r.ok && r.config.protocol).toBe("vllm-mooncake");
    expect(parseClusterDocument({ nodes: [p0, d0] }, { protocol: "vllm-mooncake" })).toMatchObject({ ok: true, config: { protocol: "vllm-mooncake" } });
  });
});

describe("cluster document: apiKeySecret names only NODE_* secrets", () => {
  it("accepts NODE_ names", () => {
    expect(paths({ nodes: [{ ...p0, apiKeySecret: "NODE_TOKEN_P0" }, d0] })).toEqual([]);
  });
  it("refuses the router's own secrets and anything outside the namespace, saying why", () => {
    for (const name of ["ADMIN_TOKEN", "API_KEYS", "METRICS_TOKEN", "node_token", "NODE_", "MY_NODE_TOKEN"]) {
      const found = problems({ nodes: [{ ...p0, apiKeySecret: name }, d0] });
      expect(found.map((p) => p.path)).toEqual(["nodes[0].apiKeySecret"]);
      expect(found[0]!.message).toContain("NODE_");
      expect(found[0]!.message).toContain("router's own secrets");
    }
  });
});

describe("cluster document: a document that parses but could not work is invalid", () => {
  it("a disaggregated protocol needs a prefill-capable and a decode-capable node", () => {
    for (const protocol of ["vllm", "vllm-mooncake", "sglang"]) {
      const onlyDecode = problems({ protocol, nodes: [d0] });
      expect(onlyDecode.map((p) => p.path)).toEqual(["nodes"]);
      expect(onlyDecode[0]!.message).toContain("prefill-capable");
      expect(problems({ protocol, nodes: [p0] })[0]!.message).toContain("decode-capable");
      expect(paths({ protocol, nodes: [{ ...p0, role: "both" }] })).toEqual([]);
    }
    // the default protocol (vllm) counts too, and colocated needs no P
    expect(paths({ nodes: [d0] })).toEqual(["nodes"]);
    expect(paths({ protocol: "colocated", nodes: [d0] })).toEqual([]);
  });

  it("health values within the bounds the README states", () => {
    const doc = (health: Record<string, unknown>) => ({ nodes: [p0, d0], health });
    expect(paths(doc({ intervalMs: 1 }))).toEqual(["health.intervalMs"]);
    expect(paths(doc({ intervalMs: 999 }))).toEqual(["health.intervalMs"]);
    expect(paths(doc({ intervalMs: 1000, probeTimeoutMs: 500 }))).toEqual([]);
    expect(paths(doc({ intervalMs: 2000, probeTimeoutMs: 2000 }))).toEqual(["health.probeTimeoutMs"]);
    expect(paths(doc({ ejectBaseMs: 10_000, ejectMaxMs: 5_000 }))).toEqual(["health.ejectMaxMs"]);
    expect(paths(doc({ downAfter: 101 }))).toEqual(["health.downAfter"]);
    expect(paths(doc({ upAfter: 0 }))).toEqual(["health.upAfter"]);
    expect(paths(doc({ ejectAfter: 1000 }))).toEqual(["health.ejectAfter"]);
    expect(paths(doc({ probePath: "health" }))).toEqual(["health.probePath"]);
    expect(paths(doc({ probePath: "/health?x=1" }))).toEqual(["health.probePath"]);
    expect(paths(doc({ probePath: "/health_generate" }))).toEqual([]);
    const message = problems(doc({ ejectBaseMs: 10_000, ejectMaxMs: 5_000 }))[0]!.message;
    expect(message).toContain("ejectBaseMs");
  });
});

describe("nodesPointingAt: nodes whose URL is the router's own origin", () => {
  const config = { nodes: [{ ...p0 }, { ...d0, url: "https://router.example.com" }, { ...d0, id: "d1", url: "http://ROUTER.example.com:80" }] } as never;
  it("finds them by origin (scheme, host, port)", () => {
    expect(nodesPointingAt(config, "https://router.example.com")).toEqual(["d0"]);
    expect(nodesPointingAt(config, "http://router.example.com")).toEqual(["d1"]);
    expect(nodesPointingAt(config, "http://router.example.com:8787")).toEqual([]);
    expect(nodesPointingAt(config, "not a url")).toEqual([]);
  });
});

describe("ClusterConfigLoader: no request ever waits on another request's I/O", () => {
  const doc = JSON.stringify({ nodes: [p0, d0] });
  function source(read: () => Promise<string | null>, ttlMs = 5000, now = () => 0): ConfigSource {
    return { read, defaults: {}, ttlMs, now };
  }

  it("concurrent calls that find the cache stale each do their own read (no shared pending promise)", async () => {
    const loader = new ClusterConfigLoader();
    const pending: Array<() => void> = [];
    let reads = 0;
    const src = source(
      () =>
        new Promise((resolve) => {
          reads++;
          pending.push(() => resolve(doc));
        }),
    );
    const a = loader.get(src);
    const b = loader.get(src);
    expect(reads).toBe(2);
    // b's read completing alone is enough for b: it does not wait for a's
    pending[1]!();
    const snapshotB = await b;
    expect(snapshotB.config?.nodes.map((n) => n.id)).toEqual(["p0", "d0"]);
    pending[0]!();
    expect((await a).config).not.toBeNull();
  });

  it("a cancelled (never finishing) read of one caller does not block the next caller", async () => {
    const loader = new ClusterConfigLoader();
    let first = true;
    const src = source(() => {
      if (first) {
        first = false;
        return new Promise<string | null>(() => undefined); // the request that started it was cancelled
      }
      return Promise.resolve(doc);
    });
    void loader.get(src);
    const snapshot = await loader.get(src);
    expect(snapshot.config).not.toBeNull();
  });

  it("a slow read of an older document never replaces a newer one", async () => {
    const loader = new ClusterConfigLoader();
    const newer = JSON.stringify({ nodes: [p0, d0, { ...d0, id: "d1" }] });
    let release: (v: string) => void = () => undefined;
    let calls = 0;
    const src = source(() => (++calls === 1 ? new Promise<string>((r) => (release = r)) : Promise.resolve(newer)), 0);
    const slow = loader.get(src);
    const fast = await loader.get(src);
    expect(fast.config?.nodes).toHaveLength(3);
    release(doc);
    expect((await slow).config?.nodes).toHaveLength(3);
  });

  it("a call that reads a new document while another is still saving it never gets the old one", async () => {
    const loader = new ClusterConfigLoader();
    let text = doc;
    let saving: (() => void) | null = null;
    const src: ConfigSource = {
      read: async () => text,
      // the Durable Object round trip that keeps the last good text: slow here
      saveLastGood: () => new Promise<void>((resolve) => (saving = resolve)),
      defaults: {},
      ttlMs: 0,
      now: () => 0,
    };
    const first = loader.get(src);
    await new Promise((r) => setTimeout(r, 0));
    (saving as (() => void) | null)?.();
    await first;
    text = JSON.stringify({ nodes: [p0, { ...d0, id: "d9" }] });
    const a = loader.get(src); // reads the new text, then waits on its save
    await new Promise((r) => setTimeout(r, 0));
    const b = await loader.get(src); // reads the same new text meanwhile
    expect(b.config?.nodes.map((n) => n.id)).toEqual(["p0", "d9"]);
    (saving as (() => void) | null)?.();
    expect((await a).config?.nodes.map((n) => n.id)).toEqual(["p0", "d9"]);
  });

  it("serves the cached snapshot within the TTL without reading", async () => {
    const loader = new ClusterConfigLoader();
    let reads = 0;
    const src = source(async () => {
      reads++;
      return doc;
    });
    await loader.get(src);
    await Promise.all([loader.get(src), loader.get(src), loader.get(src)]);
    expect(reads).toBe(1);
  });
});
