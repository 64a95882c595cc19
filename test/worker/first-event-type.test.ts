import { describe, expect, it } from "vitest";
import { eventTypeOf, RESPONSES_PREAMBLE } from "../../src/forward/decode-source";

// The type of an SSE event as readFirstEvent reads it to pass a Responses stream's preamble
// (response.created, response.in_progress: sent before D has produced anything) — pure.
describe("eventTypeOf", () => {
  it("reads the event line, else the data's own Responses type past the nested ones its response object holds", () => {
    expect(eventTypeOf('event: response.created\ndata: {"type":"response.created"}')).toBe("response.created");
    // no event line: the response object comes first, with nested types (text.format.type) before the event's own
    const created = `data: ${JSON.stringify({ response: { id: "resp_1", text: { format: { type: "text" } }, tools: [{ type: "function" }] }, sequence_number: 0, type: "response.created" })}`;
    expect(eventTypeOf(created)).toBe("response.created");
    expect(RESPONSES_PREAMBLE).toContain(eventTypeOf(created));
    // a delta whose text holds an escaped "type" is the delta
    const delta = `data: ${JSON.stringify({ delta: '{"type":"response.created"}', type: "response.output_text.delta" })}`;
    expect(eventTypeOf(delta)).toBe("response.output_text.delta");
    // a chat chunk (no Responses type): its first type, or "" — never a preamble
    expect(eventTypeOf('data: {"choices":[{"delta":{"content":"hi"}}]}')).toBe("");
    expect(eventTypeOf("data: [DONE]")).toBe("");
    // a comment has no type
    expect(eventTypeOf(": keep-alive")).toBeNull();
  });
});
