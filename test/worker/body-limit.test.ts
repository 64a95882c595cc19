import { SELF } from "cloudflare:test";
import { beforeAll, describe, expect, it } from "vitest";
import { chat, putCluster, received, resetSim } from "./helpers";

// A body sent without content-length (chunked, as a client streaming its upload does) is counted
// as it arrives: under the limit it reaches the nodes byte for byte, over it the client gets 413
// (src/auth/request-limits.ts bodyLimit; validation.test.ts has the content-length case).

/** A request whose body arrives in `pieces`, with no content-length. */
function chunkedPost(path: string, pieces: string[]) {
  const bytes = pieces.map((p) => new TextEncoder().encode(p));
  const body = new ReadableStream<Uint8Array>({
    pull(controller) {
      const next = bytes.shift();
      if (next) controller.enqueue(next);
      else controller.close();
    },
  });
  return SELF.fetch(`http://router${path}`, { method: "POST", body, headers: { "content-type": "application/json" }, duplex: "half" } as RequestInit);
}

describe("a chunked body under the limit", () => {
  beforeAll(async () => {
    await resetSim();
    await putCluster({
      protocol: "colocated",
      policy: { prefill: "round_robin", decode: "round_robin" },
      nodes: [{ id: "d0", role: "both" }],
    });
  });

  it("is read whole and routed: the node gets exactly the client's bytes", async () => {
    const text = JSON.stringify(chat("chunked body ".repeat(2000)));
    const pieces = [text.slice(0, 7), text.slice(7, 9000), text.slice(9000)];
    const res = await chunkedPost("/v1/chat/completions", pieces);
    expect(res.status).toBe(200);
    expect(((await res.json()) as any).object).toBe("chat.completion");
    const seen = (await received("d0")).filter((r) => r.path === "/v1/chat/completions");
    expect(seen).toHaveLength(1);
    expect(seen[0]!.body).toBe(text);
  });

  it("an empty chunked body reaches the handler, which names the problem", async () => {
    const res = await chunkedPost("/v1/chat/completions", []);
    expect(res.status).toBe(400);
    expect(((await res.json()) as any).error.code).toBe("invalid_json");
  });
});
