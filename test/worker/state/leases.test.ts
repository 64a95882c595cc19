import { describe, expect, it } from "vitest";
import { LeaseTable, type NodeLease } from "../../../src/state/leases";

const lease = (fields: Partial<NodeLease> = {}): NodeLease => ({
  prefill: "p0",
  decode: "d0",
  tokens: 100,
  expiresAt: 1_000,
  route: "/v1/chat/completions",
  fallbacks: { prefill: [], decode: [] },
  model: "m",
  ...fields,
});

describe("the lease table", () => {
  it("counts a lease on P while its leg runs and on D until it is released, once", () => {
    const t = new LeaseTable(1_000);
    t.take("a", lease());
    expect(t.loadOf("p0")).toMatchObject({ prefill: 1, requestsPrefill: 1 });
    expect(t.loadOf("d0")).toMatchObject({ decode: 1, tokens: 100, requestsDecode: 1 });
    expect(t.endPrefill("a", "p0")).toBe(true);
    expect(t.endPrefill("a", "p0")).toBe(false);
    expect(t.loadOf("p0")!.prefill).toBe(0);
    expect(t.release("a")?.decode).toBe("d0");
    expect(t.release("a")).toBeNull();
    expect(t.loadOf("d0")).toMatchObject({ decode: 0, tokens: 0, requestsDecode: 1 });
  });

  it("moves a role on failover and expires what was not renewed", () => {
    const t = new LeaseTable(1_000);
    t.take("a", lease({ expiresAt: 1_000 }));
    expect(t.move("a", "decode", "d1")).toEqual({ from: "d0" });
    expect(t.loadOf("d1")).toMatchObject({ decode: 1, tokens: 100 });
    expect(t.loadOf("d0")).toMatchObject({ decode: 0, tokens: 0 });
    expect(t.renew("a", 500)).toBe(true);
    expect(t.expire(1_400)).toHaveLength(0);
    expect(t.expire(1_500).map(([id]) => id)).toEqual(["a"]);
    expect(t.size).toBe(0);
  });

  it("a lease released before it was taken leaves a tombstone, consumed once", () => {
    const t = new LeaseTable(1_000);
    t.tombstone("x", 0);
    expect(t.consumeTombstone("x")).toBe(true);
    expect(t.consumeTombstone("x")).toBe(false);
    t.tombstone("y", 0);
    t.expire(2_000);
    expect(t.consumeTombstone("y")).toBe(false);
  });
});
