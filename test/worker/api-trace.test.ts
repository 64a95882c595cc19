import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { chat, expectNoLoad, post, putCluster, received, resetSim } from "./helpers";

// W3C trace context (issue 13 item 3): a client's traceparent continues through the router to
// both legs (a new parent: the router's span), tracestate passes with it, and without one the
// router starts a trace; the trace id is in the request's log line.

const rr = { prefill: "round_robin", decode: "round_robin" };
const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;

const CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN = "00f067aa0ba902b7";

function parse(header: string | undefined) {
  const m = TRACEPARENT.exec(header ?? "");
  expect(m, `traceparent ${header}`).not.toBeNull();
  return { traceId: m![1]!, parentId: m![2]!, flags: m![3]! };
}

/** The request log lines written while `run` runs (the stream's line comes when it ends). */
async function logLines(run: () => Promise<void>): Promise<any[]> {
  const lines: string[] = [];
  vi.spyOn(console, "log").mockImplementation((...args: unknown[]) => void lines.push(args.map(String).join(" ")));
  await run();
  await expectNoLoad();
  vi.restoreAllMocks();
  return lines.flatMap((l) => {
    try {
      const e = JSON.parse(l);
      return e.event === "request" ? [e] : [];
    } catch {
      return [];
    }
  });
}

describe("trace context reaches both legs", () => {
  beforeEach(resetSim);
  afterEach(() => vi.restoreAllMocks());

  it.each(["vllm", "sglang"])("%s: the client's trace id on P and D, a new parent id, flags and tracestate kept; the trace id logged", async (protocol) => {
    await putCluster({
      protocol,
      policy: rr,
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
      ],
    });
    for (const stream of [false, true]) {
      for (const flags of ["01", "00"]) {
        await resetSim();
        const requestId = `trace-${protocol}-${stream}-${flags}`;
        const logs = await logLines(async () => {
          const res = await post("/v1/chat/completions", chat("trace me", { stream }), {
            traceparent: `00-${CLIENT_TRACE}-${CLIENT_SPAN}-${flags}`,
            tracestate: "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7",
            "x-request-id": requestId,
          });
          expect(res.status).toBe(200);
          await res.text();
        });
        const [p] = await received("p0");
        const [d] = await received("d0");
        const pt = parse(p!.headers.traceparent);
        const dt = parse(d!.headers.traceparent);
        for (const t of [pt, dt]) {
          expect(t.traceId).toBe(CLIENT_TRACE);
          expect(t.parentId).not.toBe(CLIENT_SPAN);
          expect(t.parentId).not.toBe("0000000000000000");
          expect(t.flags).toBe(flags);
        }
        expect(p!.headers.tracestate).toBe("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7");
        expect(d!.headers.tracestate).toBe("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7");
        const line = logs.find((e) => e.requestId === requestId);
        expect(line).toMatchObject({ traceId: CLIENT_TRACE, status: 200 });
      }
    }
  });

  it("one hop (tokenize) and colocated carry it too", async () => {
    await putCluster({ protocol: "colocated", policy: rr, nodes: [{ id: "c0", role: "both" }] });
    for (const [path, body] of [
      ["/v1/chat/completions", chat("colocated trace")],
      ["/tokenize", { model: "sim-model", prompt: "x" }],
    ] as const) {
      const res = await post(path, body, { traceparent: `00-${CLIENT_TRACE}-${CLIENT_SPAN}-01` });
      expect(res.status).toBe(200);
      await res.text();
      const [c] = (await received("c0")).slice(-1);
      expect(parse(c!.headers.traceparent).traceId).toBe(CLIENT_TRACE);
    }
    await expectNoLoad();
  });

  it("without a traceparent the router starts a trace: one trace id for both legs and the log line", async () => {
    await putCluster({
      protocol: "vllm",
      policy: rr,
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
      ],
    });
    const ids = new Set<string>();
    for (let i = 0; i < 2; i++) {
      await resetSim();
      const requestId = `trace-started-${i}`;
      const logs = await logLines(async () => {
        const res = await post("/v1/chat/completions", chat(`no trace ${i}`), { "x-request-id": requestId, tracestate: "orphan=1" });
        expect(res.status).toBe(200);
        await res.text();
      });
      const [p] = await received("p0");
      const [d] = await received("d0");
      const pt = parse(p!.headers.traceparent);
      const dt = parse(d!.headers.traceparent);
      expect(pt.traceId).not.toMatch(/^0+$/);
      expect(dt.traceId).toBe(pt.traceId);
      expect(pt.flags).toBe("01");
      // a tracestate without a traceparent belongs to no trace: dropped
      expect(p!.headers.tracestate).toBeUndefined();
      expect(logs.find((e) => e.requestId === requestId)?.traceId).toBe(pt.traceId);
      ids.add(pt.traceId);
    }
    // each request its own trace
    expect(ids.size).toBe(2);
  });

  it.each([
    ["all-zero trace id", `00-${"0".repeat(32)}-${CLIENT_SPAN}-01`],
    ["all-zero parent id", `00-${CLIENT_TRACE}-${"0".repeat(16)}-01`],
    ["garbage", "not-a-traceparent"],
    ["short trace id", `00-${CLIENT_TRACE.slice(2)}-${CLIENT_SPAN}-01`],
  ])("an invalid traceparent (%s) starts a new trace and drops tracestate", async (_, traceparent) => {
    await resetSim();
    await putCluster({
      protocol: "vllm",
      policy: rr,
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
      ],
    });
    const res = await post("/v1/chat/completions", chat("bad trace"), { traceparent, tracestate: "congo=t61rcWkgMzE" });
    expect(res.status).toBe(200);
    await res.text();
    const [p] = await received("p0");
    const [d] = await received("d0");
    const pt = parse(p!.headers.traceparent);
    expect(pt.traceId).not.toBe(CLIENT_TRACE);
    expect(pt.traceId).not.toMatch(/^0+$/);
    expect(parse(d!.headers.traceparent).traceId).toBe(pt.traceId);
    expect(p!.headers.tracestate).toBeUndefined();
    await expectNoLoad();
  });
});
