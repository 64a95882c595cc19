import { afterEach, describe, expect, it, vi } from "vitest";
import { chat, putCluster, resetSim } from "./helpers";
import { bearer, call, eventually, KEY } from "./ops-helpers";

describe("request logs", () => {
  afterEach(() => vi.restoreAllMocks());

  it("write one JSON line per request with ids and timings, never prompt text or keys", async () => {
    await resetSim();
    await putCluster({
      protocol: "vllm",
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
      ],
    });
    const lines: string[] = [];
    const capture = (...args: unknown[]) => void lines.push(args.map(String).join(" "));
    vi.spyOn(console, "log").mockImplementation(capture);
    vi.spyOn(console, "warn").mockImplementation(capture);
    vi.spyOn(console, "error").mockImplementation(capture);

    const secretPrompt = "my-very-private-prompt-7f3a";
    const res = await call("/v1/chat/completions", {
      method: "POST",
      headers: { ...bearer(KEY), "content-type": "application/json", "x-request-id": "log-test-1" },
      body: JSON.stringify(chat(secretPrompt, { user: "user-secret-42" })),
    });
    expect(res.status).toBe(200);
    expect(await res.text()).toBeTruthy();
    const refused = await call("/v1/chat/completions", {
      method: "POST",
      headers: { authorization: "Bearer sk-wrong-key-in-log", "content-type": "application/json", "x-request-id": "log-test-2" },
      body: JSON.stringify(chat(secretPrompt)),
    });
    expect(refused.status).toBe(401);
    await refused.text();

    // one line each (written when the request ended; waited for, not slept on)
    const requests = await eventually(async () => {
      const found = lines.map((l) => JSON.parse(l)).filter((e) => e.event === "request" && String(e.requestId).startsWith("log-test-"));
      expect(found.map((e) => e.requestId).sort()).toEqual(["log-test-1", "log-test-2"]);
      return found;
    });
    const routed = requests.find((e) => e.requestId === "log-test-1");
    expect(routed).toMatchObject({ route: "/v1/chat/completions", status: 200, prefill: "p0", decode: "d0", outcome: "ok" });
    expect(typeof routed.totalMs).toBe("number");
    expect(requests.find((e) => e.requestId === "log-test-2")).toMatchObject({ status: 401, outcome: "rejected" });
    const all = lines.join("\n");
    for (const secret of [secretPrompt, "user-secret-42", KEY, "sk-wrong-key-in-log"]) expect(all).not.toContain(secret);
  });
});
