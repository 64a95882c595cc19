import { describe, expect, it } from "vitest";
import { isBusyFor } from "../../../src/routing/kv-guard";
import { readEngineMetrics } from "../../../src/state/engine-metrics";
import { EngineSignals, projectSignals } from "../../../src/state/engine-signals";
import { SilentNodes } from "../../../src/state/silent-nodes";

// Cheap signals (issue 24, item 3): an SGLang decode node's requests waiting for KV memory or for
// their KV count as waiting; figures SGLang repeats per TP/PP rank count once; a request's KV
// share is judged against the engine it lands on; a node that answers probes but gives no reading
// is named once.

// SGLang's scheduler labels (python/sglang/srt/managers/scheduler_metrics_mixin.py)
const sglangLine = (name: string, value: number, labels: Record<string, string>) =>
  `sglang:${name}{${Object.entries({ engine_type: "decode", model_name: "m", moe_ep_rank: "0", pp_rank: "0", tp_rank: "0", ...labels })
    .map(([k, v]) => `${k}="${v}"`)
    .join(",")}} ${value}`;

function sglangDecodePage(
  ranks: Array<Record<string, string>>,
  f: { queue: number; prealloc: number; transfer: number; running: number; usage: number; capacity: number },
): string {
  const lines: string[] = [];
  for (const labels of ranks) {
    lines.push(
      sglangLine("num_queue_reqs", f.queue, labels),
      sglangLine("num_decode_prealloc_queue_reqs", f.prealloc, labels),
      sglangLine("num_decode_transfer_queue_reqs", f.transfer, labels),
      sglangLine("num_running_reqs", f.running, labels),
      sglangLine("token_usage", f.usage, labels),
      sglangLine("max_total_num_tokens", f.capacity, labels),
    );
  }
  return `${lines.join("\n")}\n`;
}

const figures = { queue: 1, prealloc: 3, transfer: 2, running: 10, usage: 0.5, capacity: 100_000 };

describe("an SGLang decode node's waiting requests", () => {
  it("count the prealloc and transfer queues (requests sent to D waiting for KV memory or for their KV) with num_queue_reqs", () => {
    expect(readEngineMetrics(sglangDecodePage([{}], figures))).toMatchObject({ waiting: 6, running: 10, kvUsage: 0.5, kvCapacityTokens: 100_000 });
  });
});

describe("figures repeated per TP / PP rank count once", () => {
  it("--enable-metrics-for-all-schedulers on TP 4 x PP 2: eight copies read as one scheduler", () => {
    const copies = [0, 1, 2, 3].flatMap((tp) => [0, 1].map((pp) => ({ tp_rank: String(tp), pp_rank: String(pp) })));
    const r = readEngineMetrics(sglangDecodePage(copies, figures))!;
    expect(r).toMatchObject({ waiting: 6, running: 10, kvUsage: 0.5, kvCapacityTokens: 100_000 });
    expect(r.kvRanks).toBeUndefined();
  });

  it("DP ranks are different schedulers: summed, each with its TP copies counted once", () => {
    const ranks = [0, 1].flatMap((dp) => [0, 1].map((tp) => ({ dp_rank: String(dp), tp_rank: String(dp * 2 + tp) })));
    const r = readEngineMetrics(sglangDecodePage(ranks, figures))!;
    expect(r).toMatchObject({ waiting: 12, running: 20, kvUsage: 0.5, kvCapacityTokens: 100_000, kvRanks: 2 });
  });
});

describe("a request's KV share is judged against the engine it lands on", () => {
  const twoRanks = readEngineMetrics(sglangDecodePage([{ dp_rank: "0" }, { dp_rank: "1", tp_rank: "1" }], { ...figures, usage: 0.6 }))!;

  it("a 40,000-token prompt is 40% of one DP rank (not 20% of the node): at 0.6 used, it reaches kvBusy 0.9", () => {
    const signals = new EngineSignals();
    signals.record("d0", twoRanks, 0);
    const view = signals.view("d0", 0, 15_000)!;
    expect(view.kvCapacityTokens).toBe(100_000);
    expect(isBusyFor({ signals: view }, { kvBusy: 0.9, queueBusy: 100 }, 40_000)).toBe(true);
    expect(isBusyFor({ signals: view }, { kvBusy: 0.9, queueBusy: 100 }, 20_000)).toBe(false);
  });

  it("the prefill legs sent and ended since the poll move a queue as decode requests do (only a queue the poll saw)", () => {
    const queued = readEngineMetrics(sglangDecodePage([{ dp_rank: "0" }], { ...figures, usage: 0.2 }))!;
    const signals = new EngineSignals();
    signals.record("c0", { ...queued, waiting: 8 }, 0, 6);
    // four of the six prefill legs the poll saw have ended, one more was sent
    expect(signals.view("c0", 0, 15_000, 3)!.queue).toBe(5);
    // absent: as at the poll
    expect(signals.view("c0", 0, 15_000)!.queue).toBe(8);
    signals.record("c0", { ...queued, waiting: 0 }, 0, 6);
    expect(signals.view("c0", 0, 15_000, 9)!.queue).toBe(0);
  });

  it("what was sent since the poll spreads over both ranks' capacity (the reading is their mean)", () => {
    expect(projectSignals({ reading: twoRanks, sent: 1, sentTokens: 40_000, freed: 0, freedTokens: 0 }).kvUsage).toBeCloseTo(0.8);
  });
});

describe("a node that answers probes but never gives a reading", () => {
  it("is named after three such polls, logged once; polls while its probes are down do not count; a reading clears it", () => {
    const silent = new SilentNodes();
    expect(silent.polled("d0", false, false)).toBe(false);
    expect(silent.polled("d0", false, true)).toBe(false);
    expect(silent.polled("d0", false, true)).toBe(false);
    expect(silent.silent("d0")).toBe(false);
    expect(silent.polled("d0", false, true)).toBe(true);
    expect(silent.silent("d0")).toBe(true);
    expect(silent.polled("d0", false, true)).toBe(false);
    expect(silent.polled("d0", true, true)).toBe(false);
    expect(silent.silent("d0")).toBe(false);
  });

  it("a node that once gave a reading is not named when its polls fail later (that is a stale reading, shown as such)", () => {
    const silent = new SilentNodes();
    silent.polled("d1", true, true);
    for (let i = 0; i < 5; i++) expect(silent.polled("d1", false, true)).toBe(false);
    expect(silent.silent("d1")).toBe(false);
  });
});
