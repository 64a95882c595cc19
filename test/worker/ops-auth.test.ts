import { Hono } from "hono";
import { describe, expect, it } from "vitest";
import { clientAccess } from "../../src/auth/client-access";
import { bearerToken } from "../../src/auth/bearer";
import { keyLabel, secretEquals } from "../../src/auth/digest";
import { errorEnvelope, RouterError } from "../../src/errors";
import { chat, engineUrl, putCluster, received, resetSim } from "./helpers";
import { ALT_KEY, bearer, call, KEY, LIMITED_KEY } from "./ops-helpers";

const cluster = {
  protocol: "vllm",
  policy: { prefill: "round_robin", decode: "round_robin" },
  nodes: [
    { id: "p0", role: "prefill" as const },
    { id: "d0", role: "decode" as const },
  ],
};

const postChat = (headers: Record<string, string>, path = "/v1/chat/completions") =>
  call(path, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: JSON.stringify(chat("auth test")) });

describe("client auth with API_KEYS", () => {
  it("answers 401 authentication_error without a key, on every /v1 route", async () => {
    await putCluster(cluster);
    for (const [method, path] of [
      ["GET", "/v1/models"],
      ["POST", "/v1/chat/completions"],
      ["POST", "/v1/completions"],
      ["POST", "/v1/route"],
      ["GET", "/v1/unknown"],
    ] as const) {
      const res = await call(path, { method, headers: { "content-type": "application/json" }, body: method === "POST" ? "{}" : undefined });
      expect(res.status, path).toBe(401);
      const body = (await res.json()) as any;
      expect(body.error.type).toBe("authentication_error");
      expect(Object.keys(body.error).sort()).toEqual(["code", "message", "param", "type"]);
      expect(res.headers.get("www-authenticate")).toMatch(/^Bearer/);
    }
  });

  it("accepts every configured key (blanks around keys ignored) with the scheme in any case", async () => {
    await putCluster(cluster);
    expect((await call("/v1/models", { headers: bearer(KEY) })).status).toBe(200);
    expect((await call("/v1/models", { headers: bearer(ALT_KEY) })).status).toBe(200);
    expect((await call("/v1/models", { headers: { authorization: `BEARER ${KEY}` } })).status).toBe(200);
  });

  it("compares keys exactly and never echoes a wrong key", async () => {
    for (const wrong of [KEY.toUpperCase(), `${KEY}x`, KEY.slice(0, -1), " ", "ops-key-main,ops-key-alt", "sk-this-is-my-wrong-key"]) {
      const res = await call("/v1/models", { headers: { authorization: `Bearer ${wrong}` } });
      expect(res.status, wrong).toBe(401);
      const text = await res.text();
      if (wrong.trim().length > 3) expect(text).not.toContain(wrong.trim());
      expect(text).not.toContain(KEY);
    }
    expect((await call("/v1/models", { headers: { authorization: `Basic ${btoa(`${KEY}:`)}` } })).status).toBe(401);
  });

  it("never takes the key from the query string", async () => {
    for (const q of [`?api_key=${KEY}`, `?key=${KEY}`, `?authorization=Bearer%20${KEY}`]) {
      expect((await call(`/v1/models${q}`)).status).toBe(401);
    }
  });

  it("keeps /healthz open", async () => {
    expect((await call("/healthz")).status).toBe(200);
  });

  it("never forwards the client's key to a node", async () => {
    await resetSim();
    await putCluster(cluster);
    const res = await postChat(bearer(KEY));
    expect(res.status).toBe(200);
    await res.text();
    for (const id of ["p0", "d0"]) {
      const [req] = await received(id);
      expect(req).toBeDefined();
      expect(req!.headers.authorization).toBeUndefined();
      expect(JSON.stringify(req)).not.toContain(KEY);
    }
  });
});

describe("hardening", () => {
  it("refuses an Authorization header over 4 KB with 431, without echoing it", async () => {
    const huge = "k".repeat(5000);
    const res = await call("/v1/models", { headers: { authorization: `Bearer ${huge}` } });
    expect(res.status).toBe(431);
    const text = await res.text();
    expect(text).not.toContain(huge.slice(0, 100));
    expect(JSON.parse(text).error.code).toBe("header_too_large");
  });

  it("lets no request choose the upstream: absolute URLs, Host and forwarding headers do not matter", async () => {
    await resetSim();
    await putCluster(cluster);
    const res = await call("/v1/chat/completions", {
      method: "POST",
      headers: {
        ...bearer(KEY),
        "content-type": "application/json",
        host: "evil.example",
        "x-forwarded-host": "evil.example",
        "x-original-url": "http://evil.example/",
        connection: "keep-alive, x-secret-hop",
        "x-secret-hop": "hop-value",
        "proxy-authorization": "Basic c2VjcmV0",
      },
      body: JSON.stringify(chat("where do I go", { url: "http://evil.example", base_url: "http://evil.example" })),
    });
    expect(res.status).toBe(200);
    await res.text();
    const [d] = await received("d0");
    for (const h of ["host", "x-forwarded-host", "x-original-url", "x-secret-hop", "proxy-authorization"]) {
      if (h === "host") expect(d!.headers.host).toBe(new URL(engineUrl("d0")).host);
      else expect(d!.headers[h], h).toBeUndefined();
    }
  });

  it("never shows a stack trace in an error", async () => {
    const res = await call("/v1/chat/completions", { method: "POST", headers: { ...bearer(KEY), "content-type": "application/json" }, body: "{not json" });
    expect(res.status).toBe(400);
    const text = await res.text();
    expect(text).not.toMatch(/at .*\.(ts|js):\d+/);
    expect(text).not.toContain("SyntaxError");
  });
});

describe("rate limiting (RATE_LIMITER binding)", () => {
  it("answers 429 rate_limit_error with retry-after once a key is over its limit, and only for that key", async () => {
    await putCluster(cluster);
    let limited: Response | null = null;
    // the limiter's window is fixed (60 s): a window boundary may reset the count once
    for (let i = 0; i < 120 && !limited; i++) {
      const res = await call("/v1/models", { headers: bearer(LIMITED_KEY) });
      if (res.status === 429) limited = res;
      else {
        expect(res.status).toBe(200);
        await res.arrayBuffer();
      }
    }
    expect(limited).not.toBeNull();
    const body = (await limited!.json()) as any;
    expect(body.error.type).toBe("rate_limit_error");
    expect(limited!.headers.get("retry-after")).toBe("60");
    expect((await call("/v1/models", { headers: bearer(ALT_KEY) })).status).toBe(200);
  });

  it("limits wrong API keys per client IP: guessing gets 429, then even a right key from that address waits", async () => {
    await putCluster(cluster);
    const guesser = { "cf-connecting-ip": "198.51.100.77" };
    let limited: Response | null = null;
    for (let i = 0; i < 120 && !limited; i++) {
      const res = await call("/v1/models", { headers: { ...guesser, ...bearer(`sk-guess-${i}`) } });
      if (res.status === 429) limited = res;
      else {
        expect(res.status).toBe(401);
        await res.arrayBuffer();
      }
    }
    expect(limited).not.toBeNull();
    const body = (await limited!.json()) as any;
    expect(body.error).toMatchObject({ type: "rate_limit_error", code: "too_many_failed_auth" });
    expect(limited!.headers.get("retry-after")).toBe("60");
    // the right key from the guessing address is refused too: a lucky guess is not revealed
    expect((await call("/v1/models", { headers: { ...guesser, ...bearer(KEY) } })).status).toBe(429);
    // other addresses are not affected
    expect((await call("/v1/models", { headers: { "cf-connecting-ip": "198.51.100.78", ...bearer(KEY) } })).status).toBe(200);
  });

  // The secured Worker always has API_KEYS, so keying by IP is the middleware's alone here.
  // A limiter that fails is tested through the real Worker: test/worker/runtime-rate-limiter.test.ts.
  it("keys by client IP when auth is off (the middleware alone)", async () => {
    const seen: string[] = [];
    const limiter = (allow: (key: string) => boolean) => ({
      limit: async ({ key }: { key: string }) => {
        seen.push(key);
        return { success: allow(key) };
      },
    });
    const app = new Hono();
    app.use(clientAccess({ retryAfterSeconds: 10 }) as never);
    app.get("/v1/x", (c) => c.text("ok"));
    app.onError((err, c) => (err instanceof RouterError ? c.json(errorEnvelope(err), err.status, err.headers) : c.text("boom", 500)));
    const env = { RATE_LIMITER: limiter((k) => k !== "ip:203.0.113.9") };
    expect((await app.request("/v1/x", { headers: { "cf-connecting-ip": "198.51.100.1" } }, env)).status).toBe(200);
    const res = await app.request("/v1/x", { headers: { "cf-connecting-ip": "203.0.113.9" } }, env);
    expect(res.status).toBe(429);
    expect(res.headers.get("retry-after")).toBe("10");
    expect(seen).toEqual(["ip:198.51.100.1", "ip:203.0.113.9"]);
    // no binding: no limiting
    expect((await app.request("/v1/x", { headers: { "cf-connecting-ip": "203.0.113.9" } }, {})).status).toBe(200);
  });
});

describe("secret helpers", () => {
  it("parses the bearer scheme case-insensitively and compares in constant time", async () => {
    expect(bearerToken("Bearer abc")).toBe("abc");
    expect(bearerToken("bearer   abc ")).toBe("abc");
    expect(bearerToken("Basic abc")).toBeNull();
    expect(bearerToken("Bearer")).toBeNull();
    expect(await secretEquals("abc", "abc")).toBe(true);
    expect(await secretEquals("abc", "abd")).toBe(false);
    expect(await secretEquals("", "abc")).toBe(false);
  });

  it("labels a key with a short hash that does not reveal it", async () => {
    const label = await keyLabel(KEY);
    expect(label).toMatch(/^[0-9a-f]{12}$/);
    expect(label).not.toContain(KEY);
    expect(await keyLabel(KEY)).toBe(label);
    expect(await keyLabel(ALT_KEY)).not.toBe(label);
  });
});
