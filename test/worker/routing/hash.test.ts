import { describe, expect, it } from "vitest";
import fc from "fast-check";
import { hash52, rendezvousUnit, sha256Hex } from "../../../src/routing/hash";
import { withoutFileEngines } from "../helpers";

withoutFileEngines();

describe("sha256Hex", () => {
  it("is the hex SHA-256 of the UTF-8 text", async () => {
    expect(await sha256Hex("")).toBe("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    expect(await sha256Hex("abc")).toBe("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    expect(await sha256Hex("é")).toBe(await sha256Hex("\u00e9"));
  });
});

describe("rendezvous hash", () => {
  it("is deterministic (fixed values: every isolate must agree)", () => {
    // Pinned so that a change of the mix, which would reshuffle every key of a live cluster, is seen.
    expect(hash52("")).toBe(3338908027751811);
    expect(hash52("abc")).toBe(556323267775629);
    expect(rendezvousUnit("key", "node-1")).toBe(0.5745617665473287);
  });

  it("gives a unit strictly inside (0, 1)", () => {
    fc.assert(
      fc.property(fc.string(), fc.string(), (key, id) => {
        const u = rendezvousUnit(key, id);
        expect(u).toBeGreaterThan(0);
        expect(u).toBeLessThan(1);
        expect(Number.isFinite(Math.log(u))).toBe(true);
      }),
    );
  });

  it("separates key and node id (no concatenation collisions)", () => {
    expect(rendezvousUnit("ab", "c")).not.toBe(rendezvousUnit("a", "bc"));
  });

  it("is close to uniform over similar keys", () => {
    const buckets = new Array<number>(10).fill(0);
    const n = 50_000;
    for (let i = 0; i < n; i++) {
      const u = rendezvousUnit(`key-${i}`, "node");
      buckets[Math.floor(u * 10)]! += 1;
    }
    for (const count of buckets) expect(Math.abs(count - n / 10)).toBeLessThan((n / 10) * 0.05);
  });
});
