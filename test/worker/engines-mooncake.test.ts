// Issue 10 against the strict simulator, vllm-mooncake protocol: vLLM's MooncakeConnector flow
// (P and D at once, a router-made transfer_id, D told P's bootstrap address and engine id).
import { beforeEach, describe, expect, it } from "vitest";
import { chat, control, expectNoLoad, fault, post, putCluster, received, resetClusterState, resetSim, type NodeSpec } from "./helpers";
import { answerText, expectedPrefix, longPrompt, sseEvents, stats, streamedText, waitFor } from "./engines-helpers";

/** The Mooncake bootstrap server of a simulated P answers on its HTTP port. */
async function prefillNode(id: string): Promise<NodeSpec> {
  const { bootstrapPort } = await control(`/engines/${id}/options`);
  return { id, role: "prefill", bootstrapPort } as NodeSpec;
}

async function mooncake(decode = ["d0"]) {
  await putCluster({
    protocol: "vllm-mooncake",
    policy: { prefill: "round_robin", decode: "round_robin" },
    nodes: [await prefillNode("pslow"), ...decode.map((id) => ({ id, role: "decode" as const }))],
  });
}

const bodyOf = (r: { body: string }) => JSON.parse(r.body);

describe("vllm-mooncake: P and D sent at once with one transfer_id", () => {
  beforeEach(async () => {
    await resetSim();
    await resetClusterState();
  });

  it("D gets P's bootstrap address and the engine id from P's /query, concurrently with P; the answer is this prompt's", async () => {
    await mooncake();
    // P holds its prefill 1.5 s: D's leg must reach D while P is still at it (concurrently, not after)
    await fault("pslow", { mode: "slow", delayMs: 1500, count: 1 });
    const body = chat(longPrompt("mooncake flow", 8000), { stream: true });
    const pending = post("/v1/chat/completions", body);
    await waitFor(
      () => stats("pslow"),
      (s) => s.inflight === 1,
      10_000,
      "P's leg on P",
    );
    const during = await waitFor(
      async () => ({ p: (await stats("pslow")).inflight, d: (await received("d0")).length }),
      (s) => s.d === 1 || s.p === 0,
      10_000,
      "D's leg sent",
    );
    expect(during).toEqual({ p: 1, d: 1 });
    const res = await pending;
    expect(res.status).toBe(200);
    expect(streamedText(sseEvents(await res.text())).startsWith(expectedPrefix(body))).toBe(true);

    const [p] = await received("pslow");
    const [d] = await received("d0");
    const pKv = bodyOf(p!).kv_transfer_params;
    const dKv = bodyOf(d!).kv_transfer_params;
    const { mooncakeEngineId, bootstrapPort } = await control("/engines/pslow/options");
    expect(pKv).toEqual({ do_remote_decode: true, do_remote_prefill: false, transfer_id: expect.any(String) });
    expect(dKv).toEqual({
      do_remote_decode: false,
      do_remote_prefill: true,
      remote_bootstrap_addr: `http://127.0.0.1:${bootstrapPort}`,
      remote_engine_id: mooncakeEngineId,
      transfer_id: pKv.transfer_id,
    });
    expect(bodyOf(p!).stream).toBe(false);
    expect(bodyOf(p!).max_tokens).toBe(1);
    expect(p!.headers["x-request-id"]).toBe(d!.headers["x-request-id"]);
    const ps = await stats("pslow");
    expect(ps.requests.mooncakePrefill).toBe(1);
    expect((await stats("d0")).requests.mooncakeDecode).toBe(1);
    expect((await stats("d0")).staleHandleReads).toBe(0);
    expect(ps.heldHandles).toBe(0);
    expect(ps.protocolViolations + (await stats("d0")).protocolViolations).toBe(0);
    await expectNoLoad();
  });

  it("a P restart (new engine id) is recovered from: the retry asks P's bootstrap server again", async () => {
    await mooncake(["d0", "d1"]);
    const first = chat(longPrompt("before restart", 1000));
    expect((await post("/v1/chat/completions", first)).status).toBe(200);
    const before = (await control("/engines/pslow/options")).mooncakeEngineId;
    await control("/engines/pslow/stop", {});
    await control("/engines/pslow/start", {});
    const after = (await control("/engines/pslow/options")).mooncakeEngineId;
    expect(after).not.toBe(before);

    const body = chat(longPrompt("after restart", 1000));
    const res = await post("/v1/chat/completions", body);
    expect(res.status).toBe(200);
    expect(answerText(await res.json()).startsWith(expectedPrefix(body))).toBe(true);
    const last = (await received(res.headers.get("x-pd-decode")!)).at(-1)!;
    expect(bodyOf(last).kv_transfer_params.remote_engine_id).toBe(after);
    // and the requests after it need no retry
    for (const content of ["after restart two", "after restart three"]) {
      const again = chat(longPrompt(content, 1000));
      const r = await post("/v1/chat/completions", again);
      expect(r.status).toBe(200);
      expect(answerText(await r.json()).startsWith(expectedPrefix(again))).toBe(true);
    }
    await expectNoLoad();
  });
});
