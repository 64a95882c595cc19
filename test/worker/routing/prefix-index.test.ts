import { describe, expect, it } from "vitest";
import fc from "fast-check";
import { DEFAULT_MAX_BLOCKS_PER_REQUEST, PrefixIndex } from "../../../src/routing/prefix-index";
import { withoutFileEngines } from "../helpers";

withoutFileEngines();

const chain = (name: string, n: number) => Array.from({ length: n }, (_, i) => `${name}${i}`);

describe("PrefixIndex", () => {
  it("counts the leading blocks each node holds, stopping at the first it lacks", () => {
    const index = new PrefixIndex(100);
    index.record(["s", "a1", "a2", "a3"], "n1");
    index.record(["s", "b1"], "n2");
    index.record(["s", "a1"], "n3");
    expect(index.match(["s", "a1", "a2", "a3", "a4"], ["n1", "n2", "n3", "n4"])).toEqual({ n1: 4, n2: 1, n3: 2, n4: 0 });
    expect(index.match(["x", "a1"], ["n1"])).toEqual({ n1: 0 });
    expect(index.match([], ["n1"])).toEqual({ n1: 0 });
  });

  it("a few huge unique prompts cannot flush the index: one request adds at most maxBlocks entries", () => {
    const index = new PrefixIndex(1000);
    const warm = Array.from({ length: 20 }, (_, i) => chain(`conv${i}-`, 10));
    warm.forEach((c, i) => index.record(c, `n${i % 4}`));
    // five 5,000-block prompts (a 10 MB body each), capped at 128 blocks a request
    for (let i = 0; i < 5; i++) index.record(chain(`huge${i}-`, 5000), "n0", 128);
    // each keeps its first 128 blocks and its end
    expect(index.size).toBe(200 + 5 * 129);
    warm.forEach((c, i) => expect(index.match(c, [`n${i % 4}`])).toEqual({ [`n${i % 4}`]: 10 }));
    expect(index.match(chain("huge0-", 5000), ["n0"])).toEqual({ n0: 5000 });
  });

  it("caps what one request records by default (DEFAULT_MAX_BLOCKS_PER_REQUEST, and a longer prompt's end)", () => {
    const index = new PrefixIndex(100_000);
    index.record(chain("big", 10_000), "n1");
    expect(index.size).toBe(DEFAULT_MAX_BLOCKS_PER_REQUEST + 1);
  });

  it("a conversation past the cap matches through its last turn's end; a prompt that differs past the head matches the head", () => {
    // chained hashes: block i of a prompt stands for everything up to it, so a turn that extends
    // the last one has the last one's end among its own blocks
    const index = new PrefixIndex(10_000);
    const turn1 = chain("conv-", 200);
    index.record(turn1, "n1", 128);
    index.record(turn1.slice(0, 128), "n2", 128); // n2 was sent only the head (a shorter prompt)
    const turn2 = [...turn1, ...chain("turn2-", 30)];
    expect(index.match(turn2, ["n1", "n2", "n3"])).toEqual({ n1: 200, n2: 128, n3: 0 });
    // the same head, then other text (chained: every later hash differs): the head alone
    const other = [...turn1.slice(0, 150), ...chain("other-", 80)];
    expect(index.match(other, ["n1"])).toEqual({ n1: 128 });
    // a prompt within the cap leaves no end entry
    const small = new PrefixIndex(100);
    small.record(chain("s", 10), "n1", 128);
    expect(small.size).toBe(10);
    // forgetting a node forgets its ends
    index.forget("n1");
    expect(index.match(turn2, ["n1"])).toEqual({ n1: 0 });
  });

  it("past the cap, a node holds a query through the longest prompt it was sent that the query extends (model check)", () => {
    fc.assert(
      fc.property(fc.array(fc.tuple(fc.nat(3), fc.integer({ min: 1, max: 8 }), fc.constantFrom("n1", "n2")), { maxLength: 40 }), fc.integer({ min: 1, max: 4 }), (ops, cap) => {
        const index = new PrefixIndex(10_000);
        for (const [conv, len, nodeId] of ops) index.record(chain(`c${conv}-`, len), nodeId, cap);
        for (let conv = 0; conv <= 3; conv++) {
          for (const queryLen of [cap, 6, 8]) {
            const got = index.match(chain(`c${conv}-`, queryLen), ["n1", "n2"]);
            for (const id of ["n1", "n2"]) {
              const sent = ops.filter(([c, , n]) => c === conv && n === id).map(([, len]) => len);
              const head = Math.min(Math.max(0, ...sent), cap, queryLen);
              const ends = sent.filter((len) => len > cap && len <= queryLen);
              expect(got[id]).toBe(Math.max(head, ...ends));
            }
          }
        }
      }),
    );
  });

  it("stops a node's count at a gap even when it holds later blocks", () => {
    const index = new PrefixIndex(100);
    index.record(["s", "a1", "a2"], "n1");
    index.forget("n1");
    index.record(["s", "a2"], "n1");
    expect(index.match(["s", "a1", "a2"], ["n1"])).toEqual({ n1: 1 });
  });

  it("forgets a node everywhere and drops entries nobody holds", () => {
    const index = new PrefixIndex(100);
    index.record(["s", "a1"], "n1");
    index.record(["s"], "n2");
    index.forget("n1");
    expect(index.size).toBe(1);
    expect(index.match(["s", "a1"], ["n1", "n2"])).toEqual({ n1: 0, n2: 1 });
  });

  it("is bounded, evicting the least recently used entries", () => {
    const index = new PrefixIndex(4);
    index.record(chain("a", 2), "n1"); // a0 a1
    index.record(chain("b", 2), "n1"); // b0 b1
    index.match(chain("a", 2), ["n1"]); // touch a0 a1: now b is older
    index.record(chain("c", 2), "n1"); // evicts b
    expect(index.size).toBe(4);
    expect(index.match(chain("a", 2), ["n1"])).toEqual({ n1: 2 });
    expect(index.match(chain("b", 2), ["n1"])).toEqual({ n1: 0 });
    expect(index.match(chain("c", 2), ["n1"])).toEqual({ n1: 2 });
  });

  it("keeps a long request's head blocks over its tail when over capacity", () => {
    const index = new PrefixIndex(3);
    index.record(chain("a", 5), "n1");
    expect(index.size).toBe(3);
    expect(index.match(chain("a", 5), ["n1"])).toEqual({ n1: 3 });
  });

  it("never exceeds its bound and matches what was recorded (model check)", () => {
    fc.assert(
      fc.property(fc.array(fc.tuple(fc.nat(5), fc.integer({ min: 1, max: 6 }), fc.constantFrom("n1", "n2", "n3")), { maxLength: 60 }), (ops) => {
        const index = new PrefixIndex(1000); // large: nothing evicted, so it must agree with a plain model
        const model = new Map<string, Set<string>>();
        for (const [conv, len, nodeId] of ops) {
          const hashes = chain(`c${conv}-`, len);
          index.record(hashes, nodeId);
          for (const h of hashes) model.set(h, (model.get(h) ?? new Set()).add(nodeId));
        }
        for (let conv = 0; conv <= 5; conv++) {
          const hashes = chain(`c${conv}-`, 6);
          const got = index.match(hashes, ["n1", "n2", "n3"]);
          for (const id of ["n1", "n2", "n3"]) {
            let expected = 0;
            while (expected < hashes.length && model.get(hashes[expected]!)?.has(id)) expected++;
            expect(got[id]).toBe(expected);
          }
        }
        const small = new PrefixIndex(7);
        for (const [conv, len, nodeId] of ops) small.record(chain(`c${conv}-`, len), nodeId);
        expect(small.size).toBeLessThanOrEqual(7);
      }),
    );
  });
});
