import { describe, expect, it } from "vitest";
import fc from "fast-check";
import { canonicalPromptText, prefixBlockHashes } from "../../../src/routing/prefix-blocks";
import { sha256Hex } from "../../../src/routing/hash";
import { withoutFileEngines } from "../helpers";

withoutFileEngines();

describe("prefixBlockHashes", () => {
  it("hashes full blocks only, each chained on the previous hash", async () => {
    const text = "abcdefghij"; // blocks of 4: "abcd", "efgh"; "ij" is partial
    const hashes = await prefixBlockHashes(text, 4);
    const h0 = (await sha256Hex("abcd")).slice(0, 16);
    const h1 = (await sha256Hex(h0 + "efgh")).slice(0, 16);
    expect(hashes).toEqual([h0, h1]);
    expect(await prefixBlockHashes(text, 4, 1)).toEqual([h0]);
    expect(await prefixBlockHashes("abc", 4)).toEqual([]);
  });

  it("equal hash i exactly when the text agrees up to the end of block i", async () => {
    await fc.assert(
      fc.asyncProperty(fc.string({ minLength: 0, maxLength: 40 }), fc.string({ maxLength: 40 }), fc.string({ maxLength: 40 }), async (shared, a, b) => {
        const size = 5;
        const ha = await prefixBlockHashes(shared + a, size);
        const hb = await prefixBlockHashes(shared + b, size);
        const common = Math.floor(shared.length / size);
        expect(ha.slice(0, common)).toEqual(hb.slice(0, common));
        for (let i = 0; i < Math.min(ha.length, hb.length); i++) {
          const same = (shared + a).slice(0, (i + 1) * size) === (shared + b).slice(0, (i + 1) * size);
          expect(ha[i] === hb[i]).toBe(same);
        }
      }),
      { numRuns: 50 },
    );
  });

  it("same block text at another position hashes differently (chained)", async () => {
    const [first, second] = await prefixBlockHashes("xxxxxxxx", 4);
    expect(first).not.toBe(second);
  });

  it("handles a 120k-character prompt (240 blocks of 512) quickly enough for the hot path", async () => {
    const text = Array.from({ length: 120_000 }, (_, i) => String.fromCharCode(97 + ((i * 7919) % 26))).join("");
    await prefixBlockHashes(text.slice(0, 4096), 512); // warm up
    const started = performance.now();
    const hashes = await prefixBlockHashes(text, 512);
    const elapsed = performance.now() - started;
    expect(hashes).toHaveLength(234);
    // Measured, not asserted (timing varies by machine): a few ms is expected.
    console.log(`prefixBlockHashes: 120k chars, ${hashes.length} blocks in ${elapsed.toFixed(2)} ms`);
  });
});

describe("canonicalPromptText", () => {
  it("renders chat messages role-aware, string and text parts alike", () => {
    const plain = canonicalPromptText(
      {
        messages: [
          { role: "system", content: "S" },
          { role: "user", content: "hello" },
        ],
      },
      "chat",
    );
    expect(plain).toBe("<|system|>\nS\n<|user|>\nhello\n");
    const parts = canonicalPromptText(
      {
        messages: [
          { role: "system", content: [{ type: "text", text: "S" }] },
          {
            role: "user",
            content: [
              { type: "text", text: "hello" },
              { type: "input_audio", input_audio: {} },
            ],
          },
        ],
      },
      "chat",
    );
    expect(parts).toBe(plain);
  });

  it("makes a later turn extend the earlier turn's text", () => {
    const turn1 = [{ role: "user", content: "q1" }];
    const turn2 = [...turn1, { role: "assistant", content: "a1" }, { role: "user", content: "q2" }];
    const t1 = canonicalPromptText({ messages: turn1 }, "chat");
    expect(canonicalPromptText({ messages: turn2 }, "chat").startsWith(t1)).toBe(true);
  });

  it("takes completion prompts as is, token prompts joined with commas", () => {
    expect(canonicalPromptText({ prompt: "abc" }, "completion")).toBe("abc");
    expect(canonicalPromptText({ prompt: [1, 22, 333] }, "completion")).toBe("1,22,333");
    expect(canonicalPromptText({ prompt: ["first", "second"] }, "completion")).toBe("first");
    expect(canonicalPromptText({}, "completion")).toBe("");
  });
});
