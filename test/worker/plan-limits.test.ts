import { describe, expect, it } from "vitest";
import { alarmSubrequests, assignPollers, pollerRunSubrequests, withPlanLimits } from "../../src/config/plan";
import { parseClusterDocument } from "../../src/config/schema";

// Cloudflare counts subrequests per invocation: Workers Free 50 external ones, Workers Paid 10,000
// by default (developers.cloudflare.com/workers/platform/limits/#subrequests). The WORKERS_PLAN var
// names the plan; a document whose pool would need more in one invocation — a run of the alarm
// (a slice of the probes and of the polls) or one GET /v1/models — is refused, naming why.

const nodes = (n: number, models?: string[]) =>
  Array.from({ length: n }, (_, i) => ({ id: `n${i}`, url: `http://10.1.${i >> 8}.${i & 255}:8000`, role: "both", ...(models ? { models } : {}) }));
const parse = (doc: Record<string, unknown>, plan?: string) => parseClusterDocument({ protocol: "colocated", ...doc }, withPlanLimits({ plan }));
const problemsOf = (doc: Record<string, unknown>, plan?: string) => {
  const parsed = parse(doc, plan);
  return parsed.ok ? [] : parsed.problems;
};

describe("the plan check refuses a document too large for the Workers plan", () => {
  it("Free: 60 nodes without a models list would make GET /v1/models ask 60 nodes in one request: refused, saying how to fix it", () => {
    const problems = problemsOf({ nodes: nodes(60) }, "free");
    expect(problems).toHaveLength(1);
    expect(problems[0]!.path).toBe("nodes");
    expect(problems[0]!.message).toMatch(/GET \/v1\/models would ask 60 nodes/);
    expect(problems[0]!.message).toMatch(/Workers Free plan.*\(50; WORKERS_PLAN var/);
    expect(problems[0]!.message).toMatch(/"models" list/);
  });

  it("Free: 40 such nodes fit (the alarm sends 20 a run, /v1/models asks 40)", () => {
    expect(problemsOf({ nodes: nodes(40) }, "free")).toEqual([]);
  });

  it("Free: 512 nodes serving one model are refused at the default periods (56 a run, sharded) and fit with minute-long ones", () => {
    // polled by the pool's own alarm: a probe slice and a poll slice; sharded (above 256 nodes by
    // default): a probe slice and a call to each of the 4 pollers, which send the polls themselves
    expect(alarmSubrequests(512, { health: { intervalMs: 10_000 }, signals: { intervalMs: 5_000, shardAbove: 1_000 } } as never)).toBe(52 + 103);
    expect(alarmSubrequests(512, { health: { intervalMs: 10_000 }, signals: { intervalMs: 5_000 } } as never)).toBe(52 + 4);
    const problems = problemsOf({ nodes: nodes(512, ["m"]) }, "free");
    expect(problems.map((p) => p.path)).toEqual(["nodes"]);
    expect(problems[0]!.message).toMatch(/512 nodes in one pool make its alarm send up to 56 subrequests a run/);
    expect(problems[0]!.message).toMatch(/health\.intervalMs and signals\.intervalMs/);
    expect(problemsOf({ nodes: nodes(512, ["m"]), health: { intervalMs: 60_000 }, signals: { intervalMs: 60_000, staleMs: 180_000 } }, "free")).toEqual([]);
  });

  it("Free: a poller's own run counts too — one poller for 300 nodes would send 61 a run (a fifth of its 300 polls and one push): refused, naming signals.nodesPerPoller; 100 a poller fits", () => {
    const many = nodes(300, ["m"]);
    const one = { nodes: many, signals: { shardAbove: 100, nodesPerPoller: 300 } };
    // the pool's own alarm stays within the plan (30 probes and one call to the poller)
    expect(alarmSubrequests(300, { health: { intervalMs: 10_000 }, signals: { intervalMs: 5_000, shardAbove: 100, nodesPerPoller: 300 } } as never)).toBe(31);
    expect(pollerRunSubrequests(many, { signals: { intervalMs: 5_000, shardAbove: 100, nodesPerPoller: 300 } } as never)).toBe(61);
    const problems = problemsOf(one, "free");
    expect(problems.map((p) => p.path)).toEqual(["signals.nodesPerPoller"]);
    expect(problems[0]!.message).toMatch(/each poller object of a pool of 300 nodes would send up to 61 subrequests a run/);
    expect(problems[0]!.message).toMatch(/Workers Free plan.*\(50; WORKERS_PLAN var/);
    // three pollers: the largest rendezvous share, a fifth of it a run, and the push
    const largest = Math.max(...assignPollers(many, 3).map((s) => s.length));
    expect(pollerRunSubrequests(many, { signals: { intervalMs: 5_000, shardAbove: 100, nodesPerPoller: 100 } } as never)).toBe(Math.ceil(largest / 5) + 1);
    expect(problemsOf({ nodes: many, signals: { shardAbove: 100, nodesPerPoller: 100 } }, "free")).toEqual([]);
    // not sharded: no poller runs at all
    expect(pollerRunSubrequests(many, { signals: { intervalMs: 5_000, shardAbove: 1_000 } } as never)).toBe(0);
  });

  it("Paid (the default when WORKERS_PLAN is unset): 512 nodes without models lists fit", () => {
    expect(problemsOf({ nodes: nodes(512) })).toEqual([]);
    expect(problemsOf({ nodes: nodes(512) }, "paid")).toEqual([]);
  });

  it("a [limits] subrequests number is taken as the limit; a WORKERS_PLAN that names nothing is a problem of its own", () => {
    expect(problemsOf({ nodes: nodes(300) }, "200")[0]?.message).toMatch(/\[limits\] subrequests = 200/);
    expect(problemsOf({ nodes: nodes(4) }, "gold")).toEqual([{ path: "(WORKERS_PLAN)", message: expect.stringMatching(/"free", "paid"/) }]);
  });
});
