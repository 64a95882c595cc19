import { afterEach, describe, expect, it, vi } from "vitest";
import { kv, poll, putNodes, resetEngines, resetState, setMetrics, snapshot, useSignalsRig } from "./signals-helpers";

useSignalsRig();

// A node that answers its probes but whose /metrics never gives a reading — an SGLang server
// started without --enable-metrics (off by default) has no /metrics route — is named on the
// status page's data and in the log, once (issue 24, item 3).

afterEach(() => vi.restoreAllMocks());

describe("a node that answers probes but gives no reading", () => {
  it("is named in the object's status (the status page's data) after three polls, and logged once", async () => {
    await resetState();
    await resetEngines();
    await setMetrics("p0", kv(0.1));
    await setMetrics("d0", { mode: "status", status: 404 });
    await putNodes([
      { id: "p0", role: "prefill" },
      { id: "d0", role: "decode" },
    ]);
    const warn = vi.spyOn(console, "warn");
    for (let i = 0; i < 5; i++) await poll();
    const nodes = Object.fromEntries((await snapshot()).nodes.map((n) => [n.id, n]));
    expect(nodes.d0).toMatchObject({ probeUp: true, noSignals: true, signals: null });
    expect(nodes.p0).toMatchObject({ noSignals: false });
    const logged = warn.mock.calls.map((c) => String(c[0])).filter((line) => line.includes('"event":"node_signals_missing"'));
    expect(logged).toHaveLength(1);
    expect(logged[0]).toMatch(/node d0 answers its probes.*--enable-metrics/);

    // it starts answering: named no more
    await setMetrics("d0", kv(0.2));
    await poll();
    expect((await snapshot()).nodes.find((n) => n.id === "d0")).toMatchObject({ noSignals: false, signals: { kvUsage: 0.2 } });
  });
});
