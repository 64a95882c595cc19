// The rate limiter failing, through the real Worker: in the worker-runtime project RATE_LIMITER is
// bound to a service whose limit() throws, as an outage of the limiting service would
// (vitest.config.ts). A broken limiter must not take the API down: requests pass, and it is logged.
import { env } from "cloudflare:test";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { keyLabel } from "../../src/auth/digest";
import { chat, post, putCluster, resetSim } from "./helpers";

const KEY = "runtime-key";
const limiter = () => (env as unknown as { RATE_LIMITER: { asked(): Promise<string[]> } }).RATE_LIMITER;

describe("a rate limiter that throws lets requests through, and says so", () => {
  let errors: string[];
  beforeEach(async () => {
    await resetSim();
    await putCluster({
      protocol: "vllm",
      policy: { prefill: "round_robin", decode: "round_robin" },
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
      ],
    });
    await limiter().asked();
    errors = [];
    vi.spyOn(console, "error").mockImplementation((...args: unknown[]) => void errors.push(args.map(String).join(" ")));
  });
  afterEach(() => vi.restoreAllMocks());

  const failures = () => errors.filter((l) => l.includes('"event":"rate_limiter_failed"'));

  it("a request with a right key is answered, after the limiter was asked for that key", async () => {
    for (let i = 0; i < 3; i++) {
      const res = await post("/v1/chat/completions", chat(`limiter down ${i}`), { authorization: `Bearer ${KEY}` });
      expect(res.status).toBe(200);
      await res.text();
    }
    // the limiter really was asked (and threw) each time: the fail-open path ran
    expect(await limiter().asked()).toEqual(Array(3).fill(`key:${await keyLabel(KEY)}`));
    expect(failures()).toHaveLength(3);
    expect(JSON.parse(failures()[0]!).error).toContain("rate limiting service unavailable");
  });

  it("wrong keys get 401, never 429: counting failed attempts fails open too", async () => {
    const from = { "cf-connecting-ip": "198.51.100.9" };
    for (let i = 0; i < 5; i++) {
      const res = await post("/v1/chat/completions", chat("guess"), { ...from, authorization: `Bearer wrong-${i}` });
      expect(res.status).toBe(401);
      await res.text();
    }
    expect(await limiter().asked()).toEqual(Array(5).fill("auth-fail:ip:198.51.100.9"));
    expect(failures()).toHaveLength(5);
    // and the address is not blocked: the right key still works from it
    const ok = await post("/v1/chat/completions", chat("right key"), { ...from, authorization: `Bearer ${KEY}` });
    expect(ok.status).toBe(200);
    await ok.text();
  });
});
