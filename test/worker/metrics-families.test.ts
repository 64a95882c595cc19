import { runInDurableObject, SELF } from "cloudflare:test";
import { beforeEach, describe, expect, it } from "vitest";
import { withoutFileEngines } from "./helpers";
import { seriesValue } from "./ops-helpers";
import { chatBody, kv, poll, post, putNodes, resetEngines, resetState, setMetrics, signalsRig, stub, useSignalsRig, waitFor } from "./signals-helpers";

useSignalsRig();

// Eight metric families of /metrics that no test read (issue 25), each through the Worker with
// the value its producer must give: the nodes are simulated engines behind fronts whose GET
// /metrics the test sets (test/worker/signals-helpers.ts), so engine signals exist too.

withoutFileEngines();

const text = async () => (await SELF.fetch("http://router/metrics")).text();
/** The value of one series (`name{labels}` without the pd_router_ prefix) on /metrics now. */
const value = async (series: string): Promise<number | null> => seriesValue(await text(), `pd_router_${series}`);
const values = async (...series: string[]): Promise<Array<number | null>> => {
  const now = await text();
  return series.map((s) => seriesValue(now, `pd_router_${s}`));
};
const fault = async (id: string, f: Record<string, unknown>) => {
  const res = await fetch(`${signalsRig().simControlUrl}/engines/${id}/fault`, { method: "POST", body: JSON.stringify(f), headers: { "content-type": "application/json" } });
  expect(res.status).toBe(200);
  await res.arrayBuffer();
};
const run = runInDurableObject as unknown as <T>(s: unknown, cb: (instance: any) => T) => Promise<T>;

const PD = [
  { id: "p0", role: "prefill" as const },
  { id: "d0", role: "decode" as const },
];
/** 9,000 characters: four whole prefix blocks of 2,048 */
const FOUR_BLOCKS = "The quick brown fox jumps over the lazy dog. ".repeat(200);

async function answered(path: string, body: unknown): Promise<void> {
  const res = await post(path, body);
  expect(res.status, await res.clone().text()).toBe(200);
  await res.arrayBuffer();
}

beforeEach(async () => {
  await resetState();
  await run(stub(), (instance) => instance.prefixes.rates.clear());
  await resetEngines();
  for (const id of ["p0", "d0", "d1", "c0"]) await setMetrics(id, kv(0.1));
});

describe("node_draining", () => {
  it("is 1 for a node the document drains, 0 for the others, and follows the document", async () => {
    await putNodes([...PD, { id: "d1", role: "decode", drain: true } as never]);
    await poll();
    expect(await values('node_draining{node="p0"}', 'node_draining{node="d0"}', 'node_draining{node="d1"}')).toEqual([0, 0, 1]);
    await putNodes([...PD, { id: "d1", role: "decode" }]);
    await poll();
    expect(await value('node_draining{node="d1"}')).toBe(0);
  });
});

describe("node_inflight_by_role and node_inflight_prefill_tokens", () => {
  it("a request whose P is still prefilling: P's prefill and D's decode count 1, P's uncached tokens are its prefill work; all 0 after", async () => {
    await putNodes(PD);
    await poll();
    await fault("p0", { mode: "hang" });
    const client = new AbortController();
    // 4,000 characters, nothing cached: 1,000 tokens at 4 characters a token
    const held = post("/v1/completions", { model: "sim-model", prompt: "x".repeat(4000), max_tokens: 2 }, { signal: client.signal });
    await waitFor(
      "p0's prefill in flight",
      () => value('node_inflight_by_role{node="p0",role="prefill"}'),
      (v) => v === 1,
    );
    expect(await values('node_inflight_by_role{node="d0",role="decode"}', 'node_inflight_by_role{node="p0",role="decode"}')).toEqual([1, null]);
    expect(await values('node_inflight_prefill_tokens{node="p0"}', 'node_inflight_prefill_tokens{node="d0"}')).toEqual([1000, 0]);
    client.abort();
    await held.then((r) => r.arrayBuffer()).catch(() => undefined);
    await waitFor(
      "in-flight back to 0",
      () => values('node_inflight_by_role{node="p0",role="prefill"}', 'node_inflight_by_role{node="d0",role="decode"}', 'node_inflight_prefill_tokens{node="p0"}'),
      (v) => v.every((x) => x === 0),
    );
  });

  it("only the uncached part of a prompt is prefill work: a prompt whose first blocks P holds counts far fewer tokens", async () => {
    await putNodes(PD, { policy: { prefill: "cache_aware", decode: "round_robin" } });
    await poll();
    await answered("/v1/chat/completions", chatBody(FOUR_BLOCKS));
    await fault("p0", { mode: "hang" });
    const client = new AbortController();
    // the four blocks again, then 2,000 characters nobody holds: ~2,750 tokens in all, ~800 uncached
    const held = post("/v1/chat/completions", chatBody(`${FOUR_BLOCKS}and more after it: ${"y".repeat(2000)}`), { signal: client.signal });
    await waitFor(
      "p0's prefill in flight",
      () => value('node_inflight_by_role{node="p0",role="prefill"}'),
      (v) => v === 1,
    );
    const work = (await value('node_inflight_prefill_tokens{node="p0"}'))!;
    expect(work).toBeGreaterThan(400);
    expect(work).toBeLessThan(1200);
    client.abort();
    await held.then((r) => r.arrayBuffer()).catch(() => undefined);
  });
});

describe("node_chars_per_token", () => {
  it("is the rate the object learned from the node's answers, away from the default once they teach it", async () => {
    await putNodes(PD);
    await poll();
    expect(await value('node_chars_per_token{node="p0"}')).toBe(4);
    // prompts of token ids: the engine counts one token an id, the router far fewer characters than 4 an id
    for (let i = 0; i < 3; i++) await answered("/v1/completions", { model: "sim-model", prompt: Array.from({ length: 3000 }, (_, k) => (k * 7 + i) % 100), max_tokens: 2 });
    // the answers' usage reaches the object after them (their finish reports, in any order and at
    // any time): wait until /metrics shows the rate the object holds, once it has learned one
    const [shown, learned] = await waitFor(
      "p0's learned rate on /metrics",
      async () => [await value('node_chars_per_token{node="p0"}'), await run(stub(), (instance) => instance.prefixes.rates.of("p0") as number)] as const,
      ([m, r]) => r < 3.9 && m !== null && Math.abs(m - r) < 0.0005,
    );
    expect(shown).toBeCloseTo(learned, 3);
  });
});

describe("node_signals_age_seconds", () => {
  it("is the age of the node's last engine reading in seconds: it grows, and a new poll renews it", async () => {
    await putNodes(PD);
    await poll();
    // an event, not a window: wait until the reading is a second old, however long that takes here
    const old = await waitFor(
      "d0's reading a second old",
      () => value('node_signals_age_seconds{node="d0"}'),
      (v) => v !== null && v >= 1,
    );
    // seconds, not milliseconds: a reading polled moments ago is far from a minute old
    expect(old).toBeLessThan(60);
    await poll();
    expect(await value('node_signals_age_seconds{node="d0"}')).toBeLessThan(old!);
  });
});

describe("prefix_lookup_blocks_total, prefix_matched_blocks_total and prefix_index_entries", () => {
  const prefixFigures = () => values("prefix_lookup_blocks_total", "prefix_matched_blocks_total", 'prefix_index_entries{role="prefill"}', 'prefix_index_entries{role="decode"}');

  it("a prompt of four blocks: four looked up and none matched the first time, four matched the second; each index holds its four", async () => {
    await putNodes(PD, { policy: { prefill: "cache_aware", decode: "round_robin" } });
    await poll();
    const [looked0, matched0] = (await prefixFigures()) as number[];
    await answered("/v1/chat/completions", chatBody(FOUR_BLOCKS));
    expect(await prefixFigures()).toEqual([looked0! + 4, matched0!, 4, 4]);
    await answered("/v1/chat/completions", chatBody(FOUR_BLOCKS));
    expect(await prefixFigures()).toEqual([looked0! + 8, matched0! + 4, 4, 4]);
  });

  it("a node that prefills alone (colocated) is in the decode index only", async () => {
    await putNodes([{ id: "c0", role: "both" }], { protocol: "colocated", policy: { prefill: "cache_aware", decode: "cache_aware" } });
    await poll();
    await answered("/v1/chat/completions", chatBody(FOUR_BLOCKS));
    const [, , prefill, decode] = await prefixFigures();
    expect({ prefill, decode }).toEqual({ prefill: 0, decode: 4 });
  });
});
