import { describe, expect, it } from "vitest";
import type { HealthSettings } from "../../../src/config/cluster-view";
import { probeSettings } from "../../../src/state/health";
import { withoutFileEngines } from "../helpers";

withoutFileEngines();

const health = (fields: Partial<HealthSettings> = {}): HealthSettings => ({
  intervalMs: 10_000,
  downAfter: 2,
  upAfter: 2,
  ejectAfter: 3,
  ejectBaseMs: 10_000,
  ejectMaxMs: 300_000,
  ...fields,
});

describe("probeSettings: the probe each protocol's nodes get", () => {
  it("vLLM and colocated nodes: GET /health within 2 s", () => {
    for (const protocol of ["vllm", "vllm-mooncake", "colocated"]) {
      expect(probeSettings({ protocol, health: health() })).toEqual({ path: "/health", timeoutMs: 2000 });
    }
  });

  it("SGLang nodes: a path that runs no generation, and a longer timeout, so a busy node does not flap", () => {
    expect(probeSettings({ protocol: "sglang", health: health() })).toEqual({ path: "/v1/models", timeoutMs: 5000 });
    // a defaulted timeout stays below a short interval
    expect(probeSettings({ protocol: "sglang", health: health({ intervalMs: 4000 }) }).timeoutMs).toBe(2000);
  });

  it("the document's probePath and probeTimeoutMs win", () => {
    const s = probeSettings({ protocol: "sglang", health: health({ probePath: "/health_generate", probeTimeoutMs: 8000 }) });
    expect(s).toEqual({ path: "/health_generate", timeoutMs: 8000 });
  });
});
