import { describe, expect, it } from "vitest";
import { keyLabel } from "../../src/auth/digest";
import { renderMetrics } from "../../src/observability/prometheus";
import { chat, putCluster, putRawCluster, resetSim } from "./helpers";
import { ADMIN, bearer, call, eventually, KEY, LIMITED_KEY, metricsText, METRICS, seriesValue } from "./ops-helpers";

describe("Prometheus text renderer", () => {
  it("writes HELP/TYPE lines, escapes label values and renders cumulative histogram buckets", () => {
    const text = renderMetrics([
      { name: "x_total", help: "A \\ help\nline", type: "counter", samples: [{ labels: { a: 'q"uo\\te\nnl' }, value: 3 }] },
      { name: "g", help: "gauge", type: "gauge", samples: [{ value: NaN }, { labels: { k: "inf" }, value: Infinity }] },
      { name: "h_seconds", help: "histogram", type: "histogram", samples: [{ labels: { r: "1" }, bounds: [0.1, 1], counts: [2, 3], sum: 2.5, count: 6 }] },
    ]);
    expect(text).toBe(
      [
        "# HELP x_total A \\\\ help\\nline",
        "# TYPE x_total counter",
        'x_total{a="q\\"uo\\\\te\\nnl"} 3',
        "# HELP g gauge",
        "# TYPE g gauge",
        "g NaN",
        'g{k="inf"} +Inf',
        "# HELP h_seconds histogram",
        "# TYPE h_seconds histogram",
        'h_seconds_bucket{r="1",le="0.1"} 2',
        'h_seconds_bucket{r="1",le="1"} 5',
        'h_seconds_bucket{r="1",le="+Inf"} 6',
        'h_seconds_sum{r="1"} 2.5',
        'h_seconds_count{r="1"} 6',
        "",
      ].join("\n"),
    );
  });
});

describe("GET /metrics", () => {
  it("needs METRICS_TOKEN when it is set (not an API key, not the admin token)", async () => {
    expect((await call("/metrics")).status).toBe(401);
    expect((await call("/metrics", { headers: bearer(KEY) })).status).toBe(401);
    expect((await call("/metrics", { headers: bearer(ADMIN) })).status).toBe(401);
    const res = await call("/metrics", { headers: bearer(METRICS) });
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toBe("text/plain; version=0.0.4; charset=utf-8");
  });

  it("has every node series from the start, at 0", async () => {
    await putCluster({
      protocol: "vllm",
      nodes: [
        { id: "p2", role: "prefill" },
        { id: "d2", role: "decode" },
        { id: "c1", role: "both" },
      ],
    });
    const text = await metricsText();
    for (const node of ["p2", "d2", "c1"]) {
      expect(seriesValue(text, `pd_router_node_failures_total{node="${node}"}`)).toBe(0);
      expect(seriesValue(text, `pd_router_node_inflight{node="${node}"}`)).toBe(0);
      expect(seriesValue(text, `pd_router_node_healthy{node="${node}"}`)).toBe(1);
      expect(seriesValue(text, `pd_router_node_breaker_state{node="${node}",state="closed"}`)).toBe(1);
    }
    expect(seriesValue(text, 'pd_router_node_requests_total{node="p2",role="prefill"}')).toBe(0);
    expect(seriesValue(text, 'pd_router_node_requests_total{node="d2",role="decode"}')).toBe(0);
    expect(seriesValue(text, 'pd_router_node_requests_total{node="c1",role="prefill"}')).toBe(0);
    expect(seriesValue(text, 'pd_router_node_requests_total{node="c1",role="decode"}')).toBe(0);
    expect(seriesValue(text, "pd_router_config_valid")).toBe(1);
    for (const family of [
      "pd_router_requests_total",
      "pd_router_route_decisions_total",
      "pd_router_decode_ttfb_seconds",
      "pd_router_prefill_seconds",
      "pd_router_prefix_hit_ratio",
      "pd_router_key_requests_total",
    ]) {
      expect(text).toContain(`# TYPE ${family} `);
    }
    expect(text).toContain('pd_router_decode_ttfb_seconds_bucket{le="+Inf"}');
  });

  it("counts routed requests, requests refused before routing, decisions, latency and per-key requests", async () => {
    await resetSim();
    await putCluster({
      protocol: "vllm",
      policy: { prefill: "round_robin", decode: "round_robin" },
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
      ],
    });
    const before = await metricsText();
    const v = (text: string, s: string) => seriesValue(text, s) ?? 0;
    const label = await keyLabel(KEY);

    const ok = await call("/v1/chat/completions", { method: "POST", headers: { ...bearer(KEY), "content-type": "application/json" }, body: JSON.stringify(chat("metrics")) });
    expect(ok.status).toBe(200);
    await ok.text();
    expect((await call("/v1/chat/completions", { method: "POST", headers: { ...bearer(KEY), "content-type": "application/json" }, body: "{" })).status).toBe(400);
    expect((await call("/v1/chat/completions", { method: "POST", headers: { "content-type": "application/json" }, body: "{}" })).status).toBe(401);
    expect((await call("/v1/models", { headers: bearer(KEY) })).status).toBe(200);
    expect((await call("/nowhere")).status).toBe(404);

    const after = await eventually(async () => {
      const text = await metricsText();
      const grew = (s: string, by: number) => expect(v(text, s) - v(before, s), s).toBe(by);
      grew('pd_router_requests_total{route="/v1/chat/completions",status="200"}', 1);
      grew('pd_router_requests_total{route="/v1/chat/completions",status="400"}', 1);
      grew('pd_router_requests_total{route="/v1/chat/completions",status="401"}', 1);
      grew('pd_router_requests_total{route="/v1/models",status="200"}', 1);
      grew('pd_router_requests_total{route="other",status="404"}', 1);
      grew('pd_router_node_requests_total{node="p0",role="prefill"}', 1);
      grew('pd_router_node_requests_total{node="d0",role="decode"}', 1);
      grew(`pd_router_key_requests_total{key="${label}"}`, 3);
      grew("pd_router_decode_ttfb_seconds_count", 1);
      grew("pd_router_prefill_seconds_count", 1);
      return text;
    });
    expect(v(after, 'pd_router_route_decisions_total{role="decode",rule="round_robin"}')).toBeGreaterThan(0);
    expect(after).not.toContain(KEY);
  });

  it("counts every refusal before routing: 413 body too large, 429 rate limited, 431 header too large", async () => {
    await putCluster({
      protocol: "vllm",
      policy: { prefill: "round_robin", decode: "round_robin" },
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
      ],
    });
    const before = await metricsText();
    const v = (text: string, s: string) => seriesValue(text, s) ?? 0;
    const json = { ...bearer(KEY), "content-type": "application/json" };

    // 10 MB is the default MAX_BODY_BYTES
    const huge = JSON.stringify(chat("x".repeat(10 * 1024 * 1024)));
    const tooLarge = await call("/v1/chat/completions", { method: "POST", headers: json, body: huge });
    expect(tooLarge.status).toBe(413);
    await tooLarge.arrayBuffer();
    const longHeader = await call("/v1/models", { headers: { authorization: `Bearer ${"k".repeat(5000)}` } });
    expect(longHeader.status).toBe(431);
    await longHeader.arrayBuffer();
    // LIMITED_KEY's budget (40 a minute in this project) runs out
    let limited = 0;
    // (the window is fixed: a boundary may reset the count once)
    for (let i = 0; i < 120 && limited === 0; i++) {
      const res = await call("/v1/models", { headers: bearer(LIMITED_KEY) });
      if (res.status === 429) limited++;
      else expect(res.status).toBe(200);
      await res.arrayBuffer();
    }
    expect(limited).toBe(1);

    await eventually(async () => {
      const text = await metricsText();
      const grew = (s: string) => v(text, s) - v(before, s);
      expect(grew('pd_router_requests_total{route="/v1/chat/completions",status="413"}')).toBe(1);
      expect(grew('pd_router_requests_total{route="/v1/models",status="431"}')).toBe(1);
      expect(grew('pd_router_requests_total{route="/v1/models",status="429"}')).toBe(1);
    });
  });

  it("counts the estimated prompt tokens of open decode streams per node, and none once they end", async () => {
    await resetSim();
    await putCluster({
      protocol: "vllm",
      policy: { prefill: "round_robin", decode: "round_robin" },
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "slow", role: "decode" },
      ],
    });
    // the lease's estimate: the prompt's tokens as the router predicts them (its characters over
    // the node's characters per token, 4 until learned), the figure /v1/route shows for the body
    const body = JSON.stringify(chat(`a prompt of some length ${"words ".repeat(100)}`, { stream: true, max_tokens: 300 }));
    const dry = await call("/v1/route", { method: "POST", headers: { ...bearer(KEY), "content-type": "application/json" }, body });
    const predicted = ((await dry.json()) as { promptTokens: number }).promptTokens;
    expect(predicted).toBeGreaterThan(100);
    expect(predicted).toBeLessThanOrEqual(Math.ceil(body.length / 4));
    const controller = new AbortController();
    const res = await call("/v1/chat/completions", { method: "POST", headers: { ...bearer(KEY), "content-type": "application/json" }, body, signal: controller.signal });
    expect(res.status).toBe(200);
    const reader = res.body!.getReader();
    await reader.read();
    const open = await metricsText();
    expect(seriesValue(open, 'pd_router_node_inflight_tokens{node="slow"}')).toBe(predicted);
    expect(seriesValue(open, 'pd_router_node_inflight_tokens{node="p0"}')).toBe(0);
    controller.abort();
    await reader.cancel().catch(() => undefined);
    await eventually(async () => expect(seriesValue(await metricsText(), 'pd_router_node_inflight_tokens{node="slow"}')).toBe(0), 5000);
  });

  it("reports an invalid stored document as pd_router_config_valid 0", async () => {
    await putRawCluster('{"nodes": []}');
    const text = await metricsText();
    expect(seriesValue(text, "pd_router_config_valid")).toBe(0);
    expect(seriesValue(text, "pd_router_config_problems")).toBe(1);
  });
});
