import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { editMembers, memberText } from "../../src/forward/json-text";
import { withoutFileEngines } from "./helpers";

withoutFileEngines();

// Bodies are edited as text so the client's bytes (and integers beyond 2^53) pass unchanged;
// the edit must still mean exactly "drop these members, set those".
describe("editMembers edits a JSON object's top level as text", () => {
  const key = fc.constantFrom("model", "stream", "kv_transfer_params", "n", "seed", "bootstrap_room", "x\\y", "ü");
  const value = fc.jsonValue({ maxDepth: 2 });

  it("equals dropping and setting members on the parsed object, whatever the body", () => {
    fc.assert(
      fc.property(fc.dictionary(key, value), fc.dictionary(key, value), fc.subarray(["kv_transfer_params", "stream", "n"]), fc.boolean(), (body, set, drop, indented) => {
        const text = JSON.stringify(body, null, indented ? 1 : undefined);
        const out = JSON.parse(editMembers(text, Object.fromEntries(Object.entries(set).map(([k, v]) => [k, JSON.stringify(v)])), drop));
        const expected: Record<string, unknown> = { ...body };
        for (const k of [...drop, ...Object.keys(set)]) delete expected[k];
        Object.assign(expected, set);
        expect(out).toEqual(JSON.parse(JSON.stringify(expected)));
      }),
    );
  });

  it("keeps every other member byte for byte, large integers included", () => {
    const text = '{"model":"m","seed":12345678901234567890,"x":[1e400, 0.10]}';
    expect(editMembers(text, { stream: "false" }, ["kv_transfer_params"])).toBe('{"model":"m","seed":12345678901234567890,"x":[1e400, 0.10],"stream":false}');
    expect(memberText('{"kv_transfer_params":{"remote_block_ids":[9007199254740993]}}', "kv_transfer_params")).toBe('{"remote_block_ids":[9007199254740993]}');
  });

  it("drops a member whose name is spelled with escapes (a client cannot sneak in a router-owned field)", () => {
    const text = String.raw`{"model":"m","kv\u005ftransfer_params":{"remote_host":"evil"}}`;
    expect(JSON.parse(editMembers(text, {}, ["kv_transfer_params"]))).toEqual({ model: "m" });
  });
});
