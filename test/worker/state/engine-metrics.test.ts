import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { MAX_LINE_CHARS, parseSample, readEngineMetrics } from "../../../src/state/engine-metrics";
import { projectSignals } from "../../../src/state/engine-signals";
import { sglangMetricsText, vllmMetricsText } from "../../support/engine-metrics-text";
import { withoutFileEngines } from "../helpers";

withoutFileEngines();

describe("reading an engine's /metrics page", () => {
  it("vLLM v1: KV use, waiting, running and the KV capacity from cache_config_info's labels", () => {
    expect(readEngineMetrics(vllmMetricsText({ kvUsage: 0.27, waiting: 3, running: 5, capacityTokens: 16 * 1000 }))).toEqual({
      kvUsage: 0.27,
      waiting: 3,
      running: 5,
      kvCapacityTokens: 16_000,
    });
  });

  it("vLLM v0's gpu_cache_usage_perc when the v1 name is absent", () => {
    const v0 = vllmMetricsText({ kvUsage: 0.5, waiting: 0, running: 1 }).replaceAll("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc");
    expect(readEngineMetrics(v0)?.kvUsage).toBe(0.5);
  });

  it.each(["sglang:", "sglang_"] as const)("SGLang with %s names", (prefix) => {
    expect(readEngineMetrics(sglangMetricsText({ kvUsage: 0.61, waiting: 4, running: 7, capacityTokens: 500_000 }, prefix))).toEqual({
      kvUsage: 0.61,
      waiting: 4,
      running: 7,
      kvCapacityTokens: 500_000,
    });
  });

  it("several label sets on one node (DP engines or ranks): queues summed, KV use averaged, capacity one engine's of two", () => {
    const r = readEngineMetrics(vllmMetricsText({ kvUsage: 0.4, waiting: 6, running: 8, capacityTokens: 32_000 }, 2))!;
    expect(r).toMatchObject({ kvUsage: 0.4, waiting: 6, running: 8 });
    expect(r.kvCapacityTokens).toBe(16_000);
    expect(r.kvRanks).toBe(2);
  });

  it("garbage, HTML and other programs' metrics give no reading", () => {
    expect(readEngineMetrics("<html><body>502 Bad Gateway</body></html>")).toBeNull();
    expect(readEngineMetrics('go_goroutines 12\nprocess_cpu_seconds_total{a="b"} 3\n')).toBeNull();
    expect(readEngineMetrics('vllm:kv_cache_usage_perc{engine="0" 0.5\n')).toBeNull();
    fc.assert(
      fc.property(fc.string({ maxLength: 300 }), (text) => {
        const r = readEngineMetrics(text);
        return r === null || r.kvUsage === null || (r.kvUsage >= 0 && r.kvUsage <= 1);
      }),
    );
  });

  it("label values with escapes, timestamps and special values", () => {
    expect(parseSample('x{a="q\\"u,o}te",b="n\\nl"} 1.5 1700000000000')).toEqual({ name: "x", labels: { a: 'q"u,o}te', b: "n\nl" }, value: 1.5 });
    expect(parseSample("x +Inf")?.value).toBe(Number.POSITIVE_INFINITY);
    expect(parseSample("x")).toBeNull();
  });

  it("a backslash before any character keeps that character; no labels and empty labels alike; a broken line is none", () => {
    expect(parseSample('x{path="C:\\\\tmp\\q"} 2')).toEqual({ name: "x", labels: { path: "C:\\tmpq" }, value: 2 });
    expect(parseSample("x{} 3")).toEqual({ name: "x", labels: {}, value: 3 });
    expect(parseSample('x{a="1"}4')).toEqual({ name: "x", labels: { a: "1" }, value: 4 });
    expect(parseSample("x NaN")?.value).toBeNaN();
    expect(parseSample("x -Inf")?.value).toBe(Number.NEGATIVE_INFINITY);
    expect(parseSample("x abc")).toBeNull();
    expect(parseSample('x{a="1} 5')).toBeNull();
    expect(parseSample(`x{a="${"\\".repeat(50_000)}`)).toBeNull();
    expect(parseSample(`x{${'a="b",'.repeat(20_000)} 1`)).toBeNull();
  });
});

describe("the projection between polls", () => {
  const reading = { kvUsage: 0.5, waiting: 0, running: 4, kvCapacityTokens: 1000 };
  it("adds what was sent and frees what was released, within 0..1", () => {
    expect(projectSignals({ reading, sent: 2, sentTokens: 200, freed: 0, freedTokens: 0 }).kvUsage).toBeCloseTo(0.7);
    expect(projectSignals({ reading, sent: 0, sentTokens: 0, freed: 3, freedTokens: 300 }).kvUsage).toBeCloseTo(0.2);
    expect(projectSignals({ reading, sent: 9, sentTokens: 9000, freed: 0, freedTokens: 0 }).kvUsage).toBe(1);
    expect(projectSignals({ reading: { ...reading, kvCapacityTokens: null }, sent: 9, sentTokens: 9000, freed: 0, freedTokens: 0 }).kvUsage).toBe(0.5);
  });

  it("never below the decode leases the router holds on the node: a release the reading never held frees nothing under them", () => {
    // the engine had finished a 450-token request before the poll (0 held) and its release came
    // after; the router still holds 740 tokens of leases there (one of them sent since the poll)
    const empty = { ...reading, kvUsage: 0 };
    const s = { reading: empty, sent: 1, sentTokens: 270, freed: 1, freedTokens: 450 };
    expect(projectSignals(s).kvUsage).toBe(0);
    expect(projectSignals(s, 0, 740).kvUsage).toBeCloseTo(0.74);
    // the floor only ever raises: a reading above the leases (other clients' requests) stands
    expect(projectSignals({ reading, sent: 0, sentTokens: 0, freed: 0, freedTokens: 0 }, 0, 300).kvUsage).toBeCloseTo(0.5);
    // spread over all the node's engines, as what is sent
    expect(projectSignals({ reading: { ...empty, kvRanks: 2 }, sent: 0, sentTokens: 0, freed: 0, freedTokens: 0 }, 0, 740).kvUsage).toBeCloseTo(0.37);
  });

  it("a queue grows by what is sent only if the engine was queueing at the poll", () => {
    expect(projectSignals({ reading, sent: 5, sentTokens: 0, freed: 0, freedTokens: 0 }).queue).toBe(0);
    expect(projectSignals({ reading: { ...reading, waiting: 3 }, sent: 5, sentTokens: 0, freed: 2, freedTokens: 0 }).queue).toBe(6);
    expect(projectSignals({ reading: { ...reading, waiting: 3 }, sent: 0, sentTokens: 0, freed: 9, freedTokens: 0 }).queue).toBe(0);
  });
});

describe("a hostile /metrics page costs its length, never its square (issue 25 item 2)", () => {
  // Any exporter or sidecar on a node's /metrics port can write such a page; the Durable Object
  // parses every node's page on its one thread, and an invocation over its CPU limit is reset.
  const fastest = (f: () => void) => {
    let best = Number.POSITIVE_INFINITY;
    for (let k = 0; k < 3; k++) {
      const t0 = performance.now();
      f();
      best = Math.min(best, performance.now() - t0);
    }
    return best;
  };
  const good = vllmMetricsText({ kvUsage: 0.27, waiting: 3, running: 5, capacityTokens: 16 * 1000 });

  it("a 100 KB run of word characters in a read series' labels: under 50 ms, and the page's figures still read", () => {
    const page = `vllm:num_requests_running{${"a".repeat(100_000)}} 7\n${good}`;
    let r: ReturnType<typeof readEngineMetrics> = null;
    expect(fastest(() => void (r = readEngineMetrics(page)))).toBeLessThan(50);
    expect(r).toMatchObject({ kvUsage: 0.27, waiting: 3, running: 5 });
  });

  it("the same run within the line limit is parsed in one pass (the scanner, not only the skip)", () => {
    const line = `vllm:cache_config_info{${"a".repeat(MAX_LINE_CHARS - 40)}} 1`;
    expect(fastest(() => void parseSample(line))).toBeLessThan(50);
    expect(parseSample(line)).toBeNull();
    const quoted = `vllm:cache_config_info{x="${"b".repeat(MAX_LINE_CHARS - 120)}",block_size="16",num_gpu_blocks="10"} 1`;
    expect(fastest(() => void parseSample(quoted))).toBeLessThan(50);
    expect(readEngineMetrics(`${quoted}\nvllm:num_requests_waiting 2\n`)).toMatchObject({ waiting: 2, kvCapacityTokens: 160 });
  });

  it("a line over the limit is skipped, not parsed", () => {
    const long = `vllm:num_requests_waiting{x="${"c".repeat(MAX_LINE_CHARS)}"} 9\nvllm:num_requests_waiting 2\n`;
    expect(readEngineMetrics(long)?.waiting).toBe(2);
  });

  it("labels are kept only where asked for", () => {
    expect(parseSample('x{a="1"} 2', false)).toEqual({ name: "x", labels: {}, value: 2 });
  });
});
