// Builders for the object's modules and the data they are given, so each test states only what it is about.
import { NodeRateTable } from "../../../src/state/node-rates";
import { RoutingPrecision } from "../../../src/state/routing-precision";
import type { Decision, RoleDecision } from "../../../src/routing/types";
import { BoundedMap } from "../../../src/state/bounded-map";
import { RoundRobinCursors } from "../../../src/state/cursors";
import { EdgeAdmission } from "../../../src/state/edge-admission";
import type { EngineReading } from "../../../src/state/engine-metrics";
import { EngineSignals } from "../../../src/state/engine-signals";
import type { HealthSettings } from "../../../src/config/cluster-view";
import { NodeHealthTable } from "../../../src/state/health-table";
import { LeaseTable } from "../../../src/state/leases";
import { NodeHistory } from "../../../src/state/node-history";
import { PrefillUsageDetails } from "../../../src/state/prefill-usage-details";
import { PrefixMemory } from "../../../src/state/prefix-memory";
import { RecentShare } from "../../../src/state/recent-share";
import type { RouteSources, StickyPair } from "../../../src/state/route-selection";
import { RouterStats } from "../../../src/state/router-stats";
import { SilentNodes } from "../../../src/state/silent-nodes";
import type { StatusSources } from "../../../src/state/snapshot";
import type { ClusterView, RouteRequest } from "../../../src/state/types";

export type ViewNode = ClusterView["nodes"][number];

export const viewNode = (id: string, role: ViewNode["role"], fields: Partial<ViewNode> = {}): ViewNode => ({
  id,
  url: `http://127.0.0.1:1/${id}`,
  role,
  weight: 1,
  drain: false,
  ...fields,
});

export const HEALTH: HealthSettings = { intervalMs: 5_000, downAfter: 2, upAfter: 2, ejectAfter: 3, ejectBaseMs: 1_000, ejectMaxMs: 8_000 };

export function clusterView(nodes: ViewNode[], fields: Partial<ClusterView> = {}, policy: Partial<ClusterView["policy"]> = {}): ClusterView {
  return {
    version: "v1",
    protocol: "vllm",
    policy: {
      prefill: "round_robin",
      decode: "round_robin",
      pdGroup: "off",
      pdGroupBonus: 0.3,
      loadFactor: 1.25,
      loadSlack: 0,
      cacheAware: { blockChars: 512, loadFactor: 3, shareFactor: 1.1, shareHalfLife: 1000, maxBlocksPerRequest: 128 },
      // SPEC 8 defaults (the schema fills them in)
      localPrefillTokens: 2048,
      localPrefillRatio: 0.7,
      ...policy,
    },
    health: HEALTH,
    signals: { intervalMs: 5_000, staleMs: 15_000, kvBusy: 0.9, queueBusy: 8 },
    admission: { queueMs: 1_000, maxQueued: 10 },
    nodes,
    ...fields,
  };
}

export const routeRequest = (fields: Partial<RouteRequest> = {}): RouteRequest => ({
  version: "v1",
  model: "m",
  key: null,
  prefixHashes: [],
  tokens: 100,
  dryRun: false,
  ...fields,
});

export const reading = (fields: Partial<EngineReading> = {}): EngineReading => ({ kvUsage: 0.2, waiting: 0, running: 1, kvCapacityTokens: 10_000, ...fields });

const role = (id: string, rule: RoleDecision["rule"] = "round_robin", fallbacks: string[] = []): RoleDecision => ({ id, rule, candidates: [], fallbacks, failOpen: false });

/** A decision as select.ts returns it: P then D, unless `mode` says otherwise. */
export function decision(
  p: string,
  d: string,
  fields: Partial<Decision> & { prefillRule?: RoleDecision["rule"]; fallbacks?: { prefill?: string[]; decode?: string[] } } = {},
): Decision {
  const { prefillRule, fallbacks, ...rest } = fields;
  return {
    prefill: role(p, prefillRule, fallbacks?.prefill),
    decode: role(d, "round_robin", fallbacks?.decode),
    cursors: { prefill: 1, decode: 1 },
    mode: "disaggregated",
    reason: "always",
    tokens: { prompt: 300, uncachedOnDecode: null, prefillWork: 200, decodeWork: 300 },
    ...rest,
  };
}

/** The object's modules, fresh: what route-selection.ts and snapshot.ts read. */
export function modules(ttlMs = 60_000): RouteSources & StatusSources {
  return {
    health: new NodeHealthTable(),
    leases: new LeaseTable(ttlMs),
    signals: new EngineSignals(),
    recent: new RecentShare(),
    prefixes: new PrefixMemory(1_000),
    sticky: new BoundedMap<StickyPair>(100),
    cursors: new RoundRobinCursors(),
    stats: new RouterStats(),
    admission: new EdgeAdmission(),
    history: new NodeHistory(),
    usageDetails: new PrefillUsageDetails(),
    silent: new SilentNodes(),
    rates: new NodeRateTable(),
    precision: new RoutingPrecision(),
  };
}
