import { env, runInDurableObject, SELF } from "cloudflare:test";
import { describe, expect, it } from "vitest";
import { AlarmSchedule } from "../../src/state/alarm-schedule";
import { engineUrl } from "./helpers";

// When the document changes `health.intervalMs` or `signals.intervalMs`, the object's one alarm
// (src/state/alarm-schedule.ts: probes and /metrics polls, each on its own period) takes the new
// period at once — a shorter one brings the next run forward, and a longer one puts it off —
// rather than running once more at the old time and only then taking the new one.

describe("AlarmSchedule: a new period holds at once", () => {
  const periods = (probe: number, poll: number) => ({ probe, poll });

  it("a longer period puts the next run off to one new period after the last run", () => {
    const s = new AlarmSchedule();
    s.configure(periods(1_000, 1_000), 0);
    expect(s.take(periods(1_000, 1_000), 1_000).sort()).toEqual(["poll", "probe"]);
    // last run at 1000; the document now says an hour for both
    s.configure(periods(3_600_000, 3_600_000), 1_500);
    expect(s.next()).toBe(1_000 + 3_600_000);
  });

  it("each job keeps its own period: lengthening one leaves the other's next run alone", () => {
    const s = new AlarmSchedule();
    s.configure(periods(10_000, 5_000), 0);
    s.configure(periods(60_000, 5_000), 2_000);
    expect(s.next()).toBe(5_000);
    expect(s.take(periods(60_000, 5_000), 5_000)).toEqual(["poll"]);
    expect(s.take(periods(60_000, 5_000), 10_000)).toEqual(["poll"]);
    // the probe last ran at 0: due a minute later, not at its old 10 s
    expect(s.take(periods(60_000, 5_000), 59_999)).toEqual(["poll"]);
    expect(s.take(periods(60_000, 5_000), 60_000)).toEqual(["probe"]);
  });

  it("a shorter period brings the next run forward; the same periods again change nothing", () => {
    const s = new AlarmSchedule();
    s.configure(periods(3_600_000, 3_600_000), 0);
    s.configure(periods(1_000, 3_600_000), 10_000);
    expect(s.next()).toBe(11_000);
    s.configure(periods(1_000, 3_600_000), 10_500);
    expect(s.next()).toBe(11_000);
  });
});

// Two pools (nodes serving disjoint models), so this file's object is its own: "pool:alarm-a".
const POOL = "pool:alarm-a";
const stub = () => env.CLUSTER_STATE.get(env.CLUSTER_STATE.idFromName(POOL));
const storedAlarm = async (): Promise<number | null> => {
  const run = runInDurableObject as unknown as (s: unknown, cb: (instance: unknown, state: DurableObjectState) => Promise<number | null>) => Promise<number | null>;
  return run(stub() as unknown, (_instance, state) => state.storage.getAlarm());
};

async function putPeriods(intervalMs: number): Promise<void> {
  const node = (id: string, role: string, model: string) => ({ id, url: engineUrl(id), role, models: [model] });
  await env.NODES.put(
    "nodes",
    JSON.stringify({
      protocol: "vllm",
      health: { intervalMs, probeTimeoutMs: 500 },
      signals: { intervalMs, staleMs: intervalMs * 2 },
      nodes: [node("p0", "prefill", "alarm-a"), node("d0", "decode", "alarm-a"), node("p1", "prefill", "alarm-b"), node("d1", "decode", "alarm-b")],
    }),
  );
  // a dry run hands the object the new document (CONFIG_TTL_MS is 0 in the tests)
  const res = await SELF.fetch("http://router/v1/route", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "alarm-a", messages: [{ role: "user", content: "periods" }] }),
  });
  expect(res.status).toBe(200);
  await res.arrayBuffer();
}

async function alarmWhere(what: string, ok: (at: number) => boolean): Promise<number> {
  const deadline = Date.now() + 5_000;
  let at = await storedAlarm();
  while (at === null || !ok(at)) {
    if (Date.now() > deadline) throw new Error(`the object's alarm ${what}: not within 5 s; it is set for ${at === null ? "nothing" : `${at - Date.now()} ms from now`}`);
    await new Promise((r) => setTimeout(r, 25));
    at = await storedAlarm();
  }
  return at;
}

describe("the object's alarm follows the document's periods at once (health.intervalMs, signals.intervalMs)", () => {
  it("ten minutes, then an hour: the alarm moves out to an hour after the last run; then a second: it comes back within a second", async () => {
    await putPeriods(600_000);
    await alarmWhere("is set about ten minutes out", (at) => at > Date.now() + 500_000 && at <= Date.now() + 600_000);
    // longer: before, the alarm kept its old time and the old period ran once more
    await putPeriods(3_600_000);
    await alarmWhere("moved out to about an hour", (at) => at > Date.now() + 3_000_000);
    // shorter: at once
    await putPeriods(1_000);
    await alarmWhere("brought within a second", (at) => at <= Date.now() + 1_000);
  });
});
