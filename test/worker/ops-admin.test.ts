import { env } from "cloudflare:test";
import { beforeEach, describe, expect, it } from "vitest";
import { engineUrl, putRawCluster, resetSim } from "./helpers";
import { admin, ADMIN, bearer, call, KEY } from "./ops-helpers";

const doc = () => ({
  protocol: "vllm",
  policy: { prefill: "round_robin", decode: "round_robin" },
  nodes: [
    { id: "p0", url: engineUrl("p0"), role: "prefill" },
    { id: "d0", url: engineUrl("d0"), role: "decode" },
  ],
});

const storedText = () => env.NODES.get("nodes");
const stored = async () => JSON.parse((await storedText())!);

describe("admin API: authentication", () => {
  it("refuses a missing or wrong admin token with a 401 envelope that does not echo the token", async () => {
    const none = await call("/admin/nodes");
    expect(none.status).toBe(401);
    expect(((await none.json()) as any).error.type).toBe("authentication_error");
    const wrong = await call("/admin/nodes", { headers: bearer("guess-the-admin-token") });
    expect(wrong.status).toBe(401);
    const text = await wrong.text();
    expect(text).not.toContain("guess-the-admin-token");
    expect(text).not.toContain(ADMIN);
  });

  it("does not accept a client API key as the admin token", async () => {
    expect((await call("/admin/nodes", { headers: bearer(KEY) })).status).toBe(401);
  });

  it("accepts the bearer scheme in any case", async () => {
    await putRawCluster(JSON.stringify(doc()));
    expect((await call("/admin/nodes", { headers: { authorization: `bEaReR ${ADMIN}` } })).status).toBe(200);
  });
});

describe("admin API: the whole document", () => {
  beforeEach(async () => {
    await resetSim();
  });

  it("GET returns the stored document exactly, even when invalid", async () => {
    const invalid = '{ "nodes": [ { "id": "x", "url": "ftp://a", "role": "prefill" } ],\n  "protocol": "nope" }';
    await putRawCluster(invalid);
    const res = await admin("/admin/nodes");
    expect(res.status).toBe(200);
    expect(await res.text()).toBe(invalid);
  });

  it("GET answers 404 when no document is stored", async () => {
    await env.NODES.delete("nodes");
    const res = await admin("/admin/nodes");
    expect(res.status).toBe(404);
    expect(((await res.json()) as any).error.code).toBe("no_cluster_document");
  });

  it("PUT validates, then stores exactly the given text (no defaults filled in) and applies it", async () => {
    const text = JSON.stringify(doc(), null, 4) + "\n";
    const res = await admin("/admin/nodes", { method: "PUT", body: text });
    expect(res.status).toBe(200);
    expect(((await res.json()) as any).nodes).toEqual(["p0", "d0"]);
    expect(await storedText()).toBe(text);
    const round = await admin("/admin/nodes");
    expect(await round.text()).toBe(text);
    const models = await call("/v1/models", { headers: bearer(KEY) });
    expect(models.status).toBe(200);
  });

  it("PUT of an invalid document answers 400 naming every bad field and writes nothing", async () => {
    const before = JSON.stringify(doc());
    await putRawCluster(before);
    const bad = {
      protocol: "carrier-pigeon",
      timeouts: { prefillMs: -5 },
      nodes: [
        { id: "p0", url: "http://user:pw@10.0.0.1:8000", role: "prefill" },
        { id: "p0", url: "http://10.0.0.2:8000/v1", role: "chef" },
      ],
    };
    const res = await admin("/admin/nodes", { method: "PUT", body: JSON.stringify(bad) });
    expect(res.status).toBe(400);
    const body = (await res.json()) as any;
    expect(body.error.type).toBe("invalid_request_error");
    expect(body.error.code).toBe("invalid_cluster_document");
    const paths = body.error.problems.map((p: any) => p.path);
    for (const path of ["protocol", "timeouts.prefillMs", "nodes[0].url", "nodes[1].url", "nodes[1].role"]) {
      expect(paths).toContain(path);
      expect(body.error.message).toContain(path);
    }
    expect(await storedText()).toBe(before);
    const dup = { nodes: [doc().nodes[0], { ...doc().nodes[1], id: "p0" }] };
    const dupRes = await admin("/admin/nodes", { method: "PUT", body: JSON.stringify(dup) });
    expect(dupRes.status).toBe(400);
    expect(((await dupRes.json()) as any).error.message).toContain('nodes[1].id: duplicate node id "p0"');
  });

  it("PUT of text that is not JSON answers 400 and writes nothing", async () => {
    const before = JSON.stringify(doc());
    await putRawCluster(before);
    const res = await admin("/admin/nodes", { method: "PUT", body: "{ nodes: " });
    expect(res.status).toBe(400);
    expect(((await res.json()) as any).error.message).toContain("not valid JSON");
    expect(await storedText()).toBe(before);
  });
});

describe("admin API: status", () => {
  it("reports the stored document's validity, its problems and node health", async () => {
    await putRawCluster(JSON.stringify(doc()));
    await call("/v1/models", { headers: bearer(KEY) }); // serve the valid one first
    let res = await admin("/admin/status");
    let body = (await res.json()) as any;
    expect(body.document).toMatchObject({ stored: true, valid: true, problems: [] });
    expect(body.nodes.map((n: any) => [n.id, n.healthy])).toEqual([
      ["p0", true],
      ["d0", true],
    ]);

    await putRawCluster(JSON.stringify({ nodes: [{ id: "p0", url: "gopher://x", role: "prefill" }] }));
    res = await admin("/admin/status");
    body = (await res.json()) as any;
    expect(body.document.valid).toBe(false);
    expect(body.document.problems.map((p: any) => p.path)).toContain("nodes[0].url");
    // the last valid document keeps serving
    expect(body.serving.stale).toBe(true);
    expect(body.nodes.map((n: any) => n.id)).toEqual(["p0", "d0"]);
  });
});

describe("admin API: single-node operations keep the rest intact", () => {
  beforeEach(async () => {
    await putRawCluster(JSON.stringify(doc()));
  });

  it("PUT /admin/nodes/:id adds a node, then replaces it", async () => {
    let res = await admin("/admin/nodes/d1", { method: "PUT", body: JSON.stringify({ url: engineUrl("d1"), role: "decode", group: "rack-b" }) });
    expect(res.status).toBe(200);
    let now = await stored();
    expect(now.nodes.map((n: any) => n.id)).toEqual(["p0", "d0", "d1"]);
    expect(now.policy).toEqual(doc().policy);
    res = await admin("/admin/nodes/d1", { method: "PUT", body: JSON.stringify({ id: "d1", url: engineUrl("d1"), role: "decode", weight: 3 }) });
    expect(res.status).toBe(200);
    now = await stored();
    expect(now.nodes[2]).toEqual({ id: "d1", url: engineUrl("d1"), role: "decode", weight: 3 });
  });

  it("refuses a node that would make the document invalid, or whose id differs from the path", async () => {
    const before = await storedText();
    let res = await admin("/admin/nodes/d1", { method: "PUT", body: JSON.stringify({ url: "http://10.0.0.9:80/path?q=1", role: "decode" }) });
    expect(res.status).toBe(400);
    expect(((await res.json()) as any).error.problems[0].path).toBe("nodes[2].url");
    res = await admin("/admin/nodes/d1", { method: "PUT", body: JSON.stringify({ id: "d2", url: engineUrl("d1"), role: "decode" }) });
    expect(res.status).toBe(400);
    expect(await storedText()).toBe(before);
  });

  it("DELETE removes one node; removing the last prefill node of a vllm cluster is refused", async () => {
    expect((await admin("/admin/nodes/p1", { method: "PUT", body: JSON.stringify({ url: engineUrl("p1"), role: "prefill" }) })).status).toBe(200);
    expect((await admin("/admin/nodes/p0", { method: "DELETE" })).status).toBe(200);
    expect((await stored()).nodes.map((n: any) => n.id)).toEqual(["d0", "p1"]);
    const res = await admin("/admin/nodes/p1", { method: "DELETE" });
    expect(res.status).toBe(400);
    const error = ((await res.json()) as any).error;
    expect(error.param).toBe("nodes");
    expect(error.message).toContain("prefill-capable");
    expect((await admin("/admin/nodes/nope", { method: "DELETE" })).status).toBe(404);
  });

  it("drain and undrain flip one node's drain flag", async () => {
    expect((await admin("/admin/nodes/d0/drain", { method: "POST" })).status).toBe(200);
    expect((await stored()).nodes[1].drain).toBe(true);
    const status = (await (await admin("/admin/status")).json()) as any;
    expect(status.nodes.find((n: any) => n.id === "d0").drain).toBe(true);
    expect((await admin("/admin/nodes/d0/undrain", { method: "POST" })).status).toBe(200);
    expect((await stored()).nodes[1]).toEqual(doc().nodes[1]);
  });

  it("refuses to edit a stored document that is not JSON", async () => {
    await putRawCluster("not json");
    const res = await admin("/admin/nodes/d0/drain", { method: "POST" });
    expect(res.status).toBe(409);
    expect(await storedText()).toBe("not json");
  });
});

describe("admin API: no lost updates (ETag / If-Match, serialised single-node edits)", () => {
  beforeEach(async () => {
    await putRawCluster(JSON.stringify(doc()));
  });

  it("GET returns an ETag of the stored text; PUT with a current If-Match writes, a stale one answers 412 and writes nothing", async () => {
    const got = await admin("/admin/nodes");
    const etag = got.headers.get("etag");
    expect(etag).toMatch(/^"[0-9a-f]+"$/);
    const text = await got.text();
    const edited = JSON.stringify({ ...JSON.parse(text), policy: { prefill: "least_load", decode: "least_load" } });
    const ok = await admin("/admin/nodes", { method: "PUT", body: edited, headers: { "if-match": etag! } });
    expect(ok.status).toBe(200);
    const newTag = ok.headers.get("etag");
    expect(newTag).not.toBe(etag);
    expect((await admin("/admin/nodes")).headers.get("etag")).toBe(newTag);
    // a second editor still holding the first ETag loses, with a 412 envelope
    const stale = await admin("/admin/nodes", { method: "PUT", body: JSON.stringify(doc()), headers: { "if-match": etag! } });
    expect(stale.status).toBe(412);
    const body = (await stale.json()) as any;
    expect(body.error).toMatchObject({ code: "precondition_failed", param: "if-match" });
    expect(await storedText()).toBe(edited);
    // If-Match: * only needs a document to exist
    expect((await admin("/admin/nodes", { method: "PUT", body: edited, headers: { "if-match": "*" } })).status).toBe(200);
  });

  it("single-node edits honour If-Match too", async () => {
    const etag = (await admin("/admin/nodes")).headers.get("etag")!;
    await putRawCluster(JSON.stringify({ ...doc(), policy: { prefill: "affinity", decode: "affinity" } })); // someone else wrote
    const res = await admin("/admin/nodes/d0/drain", { method: "POST", headers: { "if-match": etag } });
    expect(res.status).toBe(412);
    expect((await stored()).nodes[1].drain).toBeUndefined();
  });

  it("10 concurrent single-node PUTs all survive (or a loser gets a non-2xx)", async () => {
    const ids = Array.from({ length: 10 }, (_, i) => `x${i}`);
    const results = await Promise.all(
      ids.map((id, i) => admin(`/admin/nodes/${id}`, { method: "PUT", body: JSON.stringify({ url: `http://10.9.0.${i + 1}:8000`, role: "decode" }) })),
    );
    const ok = ids.filter((_, i) => results[i]!.status === 200);
    const now: string[] = (await stored()).nodes.map((n: any) => n.id);
    expect(ok).toEqual(ids); // serialised: nobody needs to lose
    // every node once, after the two that were there; the order among the ten is the order the
    // object ran the edits in, which concurrent requests do not fix
    expect(now.slice(0, 2)).toEqual(["p0", "d0"]);
    expect([...now.slice(2)].sort()).toEqual([...ids].sort());
  });
});

describe("admin API: a node may not point at the router itself", () => {
  it("PUT refuses a node whose URL is the router's own origin, naming the field", async () => {
    await putRawCluster(JSON.stringify(doc()));
    const before = await storedText();
    // the tests reach the Worker as http://router
    const looped = { ...doc(), nodes: [...doc().nodes, { id: "d9", url: "http://router", role: "decode" }] };
    const res = await admin("/admin/nodes", { method: "PUT", body: JSON.stringify(looped) });
    expect(res.status).toBe(400);
    const body = (await res.json()) as any;
    expect(body.error.problems).toEqual([{ path: "nodes[2].url", message: expect.stringContaining("router's own origin") }]);
    const single = await admin("/admin/nodes/d9", { method: "PUT", body: JSON.stringify({ url: "http://router:80", role: "decode" }) });
    expect(single.status).toBe(400);
    expect(await storedText()).toBe(before);
  });
});
