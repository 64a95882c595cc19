import { SELF } from "cloudflare:test";
import { describe, expect, it } from "vitest";
import { ADMIN, admin, bearer } from "./ops-helpers";

// The admin API's 1 MiB limit on a cluster document holds for a body sent chunked too
// (no content-length: counted as it arrives, src/auth/request-limits.ts bodyLimit).

function chunkedPut(path: string, pieces: string[]) {
  const bytes = pieces.map((p) => new TextEncoder().encode(p));
  const body = new ReadableStream<Uint8Array>({
    pull(controller) {
      const next = bytes.shift();
      if (next) controller.enqueue(next);
      else controller.close();
    },
  });
  return SELF.fetch(`http://router${path}`, { method: "PUT", body, headers: { ...bearer(ADMIN), "content-type": "application/json" }, duplex: "half" } as RequestInit);
}

describe("admin API: the document size limit on a chunked body", () => {
  it("over 1 MiB: 413 request_too_large, nothing written", async () => {
    const before = await (await admin("/admin/nodes")).text();
    const big = JSON.stringify({ nodes: [{ id: "d0", url: "http://127.0.0.1:9", role: "both" }], padding: "x".repeat(1024 * 1024) });
    const res = await chunkedPut("/admin/nodes", [big.slice(0, 1000), big.slice(1000)]);
    expect(res.status).toBe(413);
    expect(((await res.json()) as any).error).toMatchObject({ code: "request_too_large", type: "invalid_request_error" });
    expect(await (await admin("/admin/nodes")).text()).toBe(before);
  });

  it("under it: read whole and validated (here naming the unknown key)", async () => {
    const doc = JSON.stringify({ nodes: [{ id: "d0", url: "http://127.0.0.1:9", role: "both" }], padding: "x" });
    const res = await chunkedPut("/admin/nodes", [doc.slice(0, 5), doc.slice(5)]);
    expect(res.status).toBe(400);
    expect(((await res.json()) as any).error.problems).toEqual([{ path: "(document)", message: "Unrecognized key(s) in object: 'padding'" }]);
  });
});
