import { clusterState, currentConfig, invalidateConfig, numberVar } from "../config/runtime";
import type { ClusterConfig, NodeConfig, Protocol } from "../config/schema";
import { nodeAccess } from "../config/node-access";
import type { Env } from "../env";
import type { RouterError } from "../errors";
import { forwardColocated } from "../forward/colocated";
import { notifiesPItself } from "../forward/handle-release";
import { PREFILL_REPORT_DELAY_MS, RequestLife, type Ending } from "../forward/lifecycle";
import { forwardLocalPrefill } from "../forward/local-prefill";
import { wasReported, type DecodeAnswer, type ForwardContext } from "../forward/pipeline";
import { vllmPriorityOf } from "../forward/priority";
import { forwardSglang } from "../forward/sglang";
import { UpstreamFailure, type UpstreamNode } from "../forward/upstream";
import { forwardVllm } from "../forward/vllm";
import { forwardVllmMooncake } from "../forward/vllm-mooncake";
import { background } from "../observability/log";
import { traceContext } from "../observability/trace";
import { DEFAULT_LEASE_TTL_MS } from "../state/cluster-state";
import type { ClusterView, RouteRequest } from "../state/types";
import type { Ctx } from "./app-env";
import { failureOf, refuseUnservableResponse, selectionFailure } from "./failures";
import type { InferenceRequest, RequestKind } from "./request-schema";
import { CellStates } from "./cell-states";
import { buildRouteRequest, configOfVersion, unitView, type BuiltRoute } from "./route-request";

// One body's way from the client to D's first byte: build the request the object decides on,
// open its life, admit and route it, run the protocol's legs (P's, then D's). Every failure on
// the way ends the life here; the answer's relay (answer.ts) ends it otherwise.

const PROTOCOLS: Record<Protocol, (ctx: ForwardContext) => Promise<DecodeAnswer>> = {
  vllm: forwardVllm,
  "vllm-mooncake": forwardVllmMooncake,
  sglang: forwardSglang,
  colocated: forwardColocated,
};
/** failover attempts after the first, per leg */
const RETRIES = 2;

const positive = (n: number) => n > 0;

/** One body to route: what the client sent, and where it goes upstream. */
export interface BodyToRoute {
  kind: RequestKind;
  /** upstream path, e.g. /v1/chat/completions */
  path: string;
  /** the body as sent, and parsed */
  raw: string;
  body: InferenceRequest;
  requestId: string;
  /** one node, no disaggregation and no affinity key (embeddings, tokenizer) */
  oneHop?: boolean;
  /** the life, as soon as it exists */
  onLife?: (life: RequestLife) => void;
}

/** One routed request (or one prompt of a split batch) up to D's answer. */
export interface Routed {
  life: RequestLife;
  config: ClusterConfig;
  answer: DecodeAnswer;
}

/** Routes one body and runs its protocol until D answered; ends the request's life on failure. */
export async function route(c: Ctx, one: BodyToRoute): Promise<Routed> {
  const { kind, path, raw, body } = one;
  const built = await buildRouteRequest(c, kind, body, raw.length, false, one.oneHop);
  if (kind === "responses") refuseUnservableResponse(built.config.protocol, body);
  built.request.route = path;
  // cells: the first that is not busy, else a wait in the first (cell-states.ts)
  const cells = built.cells.length > 1 ? new CellStates(cellStatesOf(c.env, built.cells)) : null;
  const life = openLife(c, one, built, cells);
  one.onLife?.(life);
  life.waitedForState(built.configStateCalls);
  try {
    const { config, request } = await admit(c, one, life, built, cells);
    const answer = await forwardLegs(c.env, one, life, config, request);
    recordAnswer(life, answer, one.oneHop === true);
    return { life, config, answer };
  } catch (err) {
    throw endFailed(life, err);
  }
}

/** The request's life: its lease, renewals, legs, timers and log line from here to its one end. */
const cellStatesOf = (env: Env, cells: BuiltRoute["cells"]) => cells.map((cell) => ({ ...cell, state: clusterState(env, cell.key) }));

function openLife(c: Ctx, { path, body, requestId }: BodyToRoute, { config, pool, request, keySource }: BuiltRoute, cells: CellStates | null): RequestLife {
  const ttlMs = numberVar(c.env.LEASE_TTL_MS, DEFAULT_LEASE_TTL_MS, positive);
  return new RequestLife({
    state: cells ?? clusterState(c.env, pool),
    waitUntil: (p) => background(c, p, requestId),
    requestId,
    route: path,
    model: body.model,
    policy: `${config.policy.prefill}/${config.policy.decode}`,
    keyHash: request.key,
    keySource,
    keyLabel: c.get("keyLabel"),
    trace: traceContext(c.req.header("traceparent"), c.req.header("tracestate")),
    clientSignal: c.req.raw.signal,
    renewMs: Math.max(10, Math.floor(ttlMs / 3)),
    prefillReportDelayMs: numberVar(c.env.PREFILL_REPORT_DELAY_MS, PREFILL_REPORT_DELAY_MS),
  });
}

/**
 * Admits and routes the request (one call to the pool's object: pick P and D, take the lease, or
 * wait at the edge), and resolves the document the decision was made under.
 */
async function admit(c: Ctx, one: BodyToRoute, life: RequestLife, built: BuiltRoute, cells: CellStates | null): Promise<{ config: ClusterConfig; request: RouteRequest }> {
  const env = c.env;
  let { config, view, request } = built;
  // the object the request is in: its pool's, or the cell it is routed (or waits) in
  const unit = () => cells?.key ?? built.pool;
  // while it waits at the edge: this isolate's document, for the object to see an edit
  const refresh = async (): Promise<ClusterView | null> => {
    const fresh = await currentConfig(env);
    return fresh.config ? unitView(fresh.config, fresh.version, unit()) : null;
  };
  let routed = await life.route(request, view, refresh);
  if (!routed.ok && routed.error.kind === "stale_view") {
    // the object holds a document this isolate read before: read it again and route once more
    invalidateConfig();
    const again = await buildRouteRequest(c, one.kind, one.body, one.raw.length, false, one.oneHop);
    ({ config, view, request } = again);
    cells?.use(cellStatesOf(env, again.cells));
    request.route = one.path;
    routed = await life.route(request, view, refresh);
  }
  if (!routed.ok) throw selectionFailure(routed.error);
  if (routed.version && routed.version !== view.version)
    config = await configOfVersion(env, config, unit(), routed.version, [routed.decision.prefill.id, routed.decision.decode.id]);
  return { config, request };
}

/** Runs the protocol's legs, P's then D's (or one node's alone), until D's first byte. */
async function forwardLegs(env: Env, one: BodyToRoute, life: RequestLife, config: ClusterConfig, request: RouteRequest): Promise<DecodeAnswer> {
  const oneHop = one.oneHop === true;
  if (config.protocol === "colocated" || oneHop) life.prefillReported = true;
  const nodes = nodesOf(config);
  const ctx: ForwardContext = {
    raw: one.raw,
    parsed: one.body,
    path: one.path,
    // one-hop routes never stream (forwardOneHop refuses `stream`)
    stream: !oneHop && one.body.stream === true,
    life,
    timeouts: config.timeouts,
    retries: RETRIES,
    resolve: (id) => upstreamNode(env, nodes.get(id)!),
    // SPEC 9: vLLM's own `priority` from the tier, on nodes that run its priority scheduling
    priorityOf: (id) => (nodes.get(id)?.priorityScheduling === true ? vllmPriorityOf(request.tier ?? "default") : undefined),
    decodeNotifiesP: (id) => notifiesPItself(nodes.get(id)?.vllmVersion),
    sleep: (ms) => new Promise((r) => setTimeout(r, ms)),
  };
  // conditional disaggregation may have D prefill alone: no P leg, D's body without a handle
  const disaggregated = PROTOCOLS[config.protocol];
  const forward = oneHop ? forwardColocated : life.isLocalPrefill ? (x: ForwardContext) => forwardLocalPrefill(x, disaggregated) : disaggregated;
  return forward(ctx);
}

/** What D's answer (before its body) teaches: P's usage, the TTFT the prediction is held against, the timings. */
function recordAnswer(life: RequestLife, answer: DecodeAnswer, oneHop: boolean): void {
  if (!oneHop) reportPrefillUsage(life, answer);
  // P's answer when it ran first, then D's first event: what the predicted TTFT is held against and
  // the transfer is learned from. Only a stream's: a non-streamed answer's first byte is its last,
  // after the whole decode (taken as a TTFT it taught transfers the length of every answer)
  if (answer.body.kind === "stream") life.observe({ ttftMs: answer.prefillMs + answer.decodeMs });
  life.timings.decodeMs = answer.decodeMs;
  if (answer.prefillMs) life.timings.prefillMs = answer.prefillMs;
}

/** Ends the life of a request that failed before its answer; returns the client's error (counted: the life reported it). */
function endFailed(life: RequestLife, err: unknown): RouterError {
  const error = failureOf(err);
  const legs: Ending["legs"] = {};
  if (err instanceof UpstreamFailure && !wasReported(err)) legs[err.leg] = err.report();
  life.end({ status: error.status, outcome: error.code === "client_closed_request" ? "aborted" : "error", error: error.message, legs });
  error.counted = true;
  return error;
}

/** Per document: its nodes by id. */
const nodesById = new WeakMap<ClusterConfig, Map<string, NodeConfig>>();

function nodesOf(config: ClusterConfig): Map<string, NodeConfig> {
  let nodes = nodesById.get(config);
  if (!nodes) {
    nodes = new Map(config.nodes.map((n) => [n.id, n]));
    nodesById.set(config, nodes);
  }
  return nodes;
}

function upstreamNode(env: Env, node: NodeConfig): UpstreamNode {
  return { id: node.id, url: node.url, bootstrapPort: node.bootstrapPort, bootstrapHost: node.bootstrapHost, access: nodeAccess(env, node) };
}

/**
 * Cache-hit feedback: P's usage when P prefilled (vllm; vllm-mooncake's arrives beside D's stream
 * and is read when the request ends). A node that served alone reports through its own answer
 * (answerBody). Under sglang the router reads neither P's answer's usage nor D's (D counts the
 * KV it received as cached), so nothing is learned there.
 */
function reportPrefillUsage(life: RequestLife, answer: DecodeAnswer): void {
  const usage = answer.prefillUsage;
  if (!usage || answer.prefillNode === answer.decodeNode) return;
  life.reportEngineUsage(() =>
    usage.promptTokens === null
      ? null
      : { node: answer.prefillNode, promptTokens: usage.promptTokens, cachedTokens: usage.cachedTokens, ...(usage.anomaly ? { anomaly: true } : {}) },
  );
}
