import { env } from "cloudflare:test";
import { describe, expect, it } from "vitest";
import { app } from "../../src/app";
import { chat, putCluster } from "./helpers";
import { ADMIN, admin, bearer, call, KEY } from "./ops-helpers";

describe("status page", () => {
  it("serves a self-contained page that holds no data, with a strict CSP", async () => {
    const res = await call("/status");
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toContain("text/html");
    const csp = res.headers.get("content-security-policy")!;
    expect(csp).toContain("default-src 'none'");
    expect(csp).toMatch(/script-src 'sha256-[A-Za-z0-9+/=]+'/);
    const html = await res.text();
    expect(html).toContain('id="login-form"');
    expect(html).not.toMatch(/<script src=|<link /);
    expect(html).not.toContain(ADMIN);
  });

  it("the inline script's hash matches the CSP", async () => {
    const res = await call("/status");
    const csp = res.headers.get("content-security-policy")!;
    const script = /<script>([\s\S]*)<\/script>/.exec(await res.text())![1]!;
    const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(script));
    expect(csp).toContain(`'sha256-${btoa(String.fromCharCode(...new Uint8Array(digest)))}'`);
  });

  it("refuses a wrong admin token sent to the page", async () => {
    expect((await call("/status", { headers: bearer("nope") })).status).toBe(401);
    expect((await call("/status", { headers: bearer(ADMIN) })).status).toBe(200);
  });

  it("GET /status.json needs the admin token and lists nodes and the routing mix", async () => {
    await putCluster({
      protocol: "vllm",
      nodes: [
        { id: "p0", role: "prefill", group: "rack-a" },
        { id: "d0", role: "decode" },
      ],
    });
    expect((await call("/status.json")).status).toBe(401);
    expect((await call("/status.json", { headers: bearer(KEY) })).status).toBe(401);
    const res = await admin("/status.json");
    expect(res.status).toBe(200);
    const body = (await res.json()) as any;
    expect(body.config.valid).toBe(true);
    expect(body.nodes.map((n: any) => [n.id, n.roles, n.group, n.healthy, n.breaker])).toEqual([
      ["p0", ["prefill"], "rack-a", true, "closed"],
      ["d0", ["decode"], null, true, "closed"],
    ]);
    expect(Array.isArray(body.decisions)).toBe(true);
    // the page's "where requests were prefilled" table: the (mode, reason) pairs routed so far
    const routed = await call("/v1/chat/completions", {
      method: "POST",
      headers: { ...bearer(KEY), "content-type": "application/json" },
      body: JSON.stringify(chat("status mix")),
    });
    expect(routed.status).toBe(200);
    await routed.arrayBuffer();
    const after = (await (await admin("/status.json")).json()) as any;
    const always = after.disagg.find((d: any) => d.mode === "disaggregated" && d.reason === "always");
    expect(always?.count).toBeGreaterThanOrEqual(1);
    expect(after.disagg.every((d: any) => d.mode === "disaggregated")).toBe(true);
    // node URLs stay internal: the page does not need them
    expect(JSON.stringify(body)).not.toContain("127.0.0.1");
  });

  it("is open when STATUS_PUBLIC is true, and off (404) without ADMIN_TOKEN", async () => {
    const open = { ...env, ADMIN_TOKEN: undefined, STATUS_PUBLIC: "true" };
    expect((await app.request("/status.json", {}, open)).status).toBe(200);
    const page = await app.request("/status", {}, open);
    expect(page.status).toBe(200);
    expect(await page.text()).toContain('data-public="true"');
    const off = { ...env, ADMIN_TOKEN: undefined };
    for (const path of ["/status", "/status.json", "/admin/nodes", "/admin/status"]) {
      const res = await app.request(path, { headers: bearer(ADMIN) }, off);
      expect(res.status, path).toBe(404);
      expect(((await res.json()) as any).error.code).toBe("unknown_route");
    }
    // without METRICS_TOKEN, /metrics is open
    expect((await app.request("/metrics", {}, { ...env, METRICS_TOKEN: undefined })).status).toBe(200);
  });
});
