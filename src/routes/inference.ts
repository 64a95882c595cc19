import type { Context } from "hono";
import { clusterState, clusterView, currentConfig, requireConfig, servesModel } from "../config/runtime";
import type { ClusterConfig, NodeConfig, Protocol } from "../config/schema";
import { nodesPointingAt } from "../config/self-origin";
import type { Env } from "../env";
import { RouterError } from "../errors";
import { forwardColocated } from "../forward/colocated";
import { RequestLife, type Ending } from "../forward/lifecycle";
import { wasReported, type DecodeAnswer, type ForwardContext } from "../forward/pipeline";
import { forwardSglang } from "../forward/sglang";
import { fixUsage, fixUsageInBody, relayStream, sseUsageRewriter, type StreamEnd } from "../forward/stream";
import { UpstreamFailure, type UpstreamNode } from "../forward/upstream";
import { forwardVllm } from "../forward/vllm";
import { forwardVllmMooncake } from "../forward/vllm-mooncake";
import { affinityKey, conversationKey } from "../routing/affinity-key";
import { canonicalPromptText, prefixBlockHashes } from "../routing/prefix-blocks";
import type { Decision, Role, SelectionError } from "../routing/types";
import type { LegReport, RouteRequest } from "../state/types";
import { background } from "../observability/log";
import { traceContext } from "../observability/trace";
import { parseInferenceRequest, type InferenceRequest, type RequestKind } from "./request-schema";

export type AppEnv = { Bindings: Env; Variables: { requestId: string; keyLabel?: string } };
type Ctx = Context<AppEnv>;

const PROTOCOLS: Record<Protocol, (ctx: ForwardContext) => Promise<DecodeAnswer>> = {
  vllm: forwardVllm,
  "vllm-mooncake": forwardVllmMooncake,
  sglang: forwardSglang,
  colocated: forwardColocated,
};
/** failover attempts after the first, per leg */
const RETRIES = 2;

const KEYED_POLICIES = new Set(["affinity", "cache_aware", "least_load"]);

/** A lease lives this long without renewal (the Durable Object reads the same variable). */
export const DEFAULT_LEASE_TTL_MS = 60_000;
/** How long a write to the client may wait before the client counts as gone (it left before the response, or stopped reading). */
export const DEFAULT_CLIENT_STALL_MS = 10_000;

const intVar = (value: unknown, fallback: number) => {
  const n = Number(value);
  return typeof value === "string" && value !== "" && Number.isFinite(n) && n > 0 ? n : fallback;
};

/** Everything the Durable Object needs to decide, computed once in the Worker (hashing included). */
export async function buildRouteRequest(
  c: Ctx,
  kind: RequestKind,
  body: InferenceRequest,
  /** characters of the body as sent: the lease's token estimate (about 4 a token) */
  bodyChars: number,
  dryRun: boolean,
): Promise<{ config: ClusterConfig; version: string; request: RouteRequest; keySource: string | null; prefixBlocks: number }> {
  const snapshot = await currentConfig(c.env);
  const config = requireConfig(snapshot);
  const model = body.model;
  const colocated = config.protocol === "colocated";
  const serving = (role: Role) => config.nodes.some((n) => servesModel(n, model) && (n.role === role || n.role === "both"));
  if (!serving("decode") || (!colocated && !serving("prefill"))) {
    throw new RouterError(404, `The model '${model}' does not exist or no node serves it.`, "not_found_error", "model_not_found", "model");
  }
  const looping = nodesPointingAt(config, new URL(c.req.url).origin);
  if (looping.length) {
    throw new RouterError(508, `The cluster document points node(s) ${looping.join(", ")} at the router itself.`, "server_error", "routing_loop");
  }
  const policy = config.policy;
  const keyed = KEYED_POLICIES.has(policy.prefill) || KEYED_POLICIES.has(policy.decode);
  const affinity = keyed ? await affinityKey({ sessionId: c.req.header("x-session-id") ?? null, body, kind }) : null;
  const cacheAware = policy.prefill === "cache_aware" || policy.decode === "cache_aware";
  // Only cache_aware needs the prompt rendered as one string; the rest of the policies never pay for it.
  const prefixHashes = cacheAware ? await prefixBlockHashes(canonicalPromptText(body, kind), policy.cacheAware.blockChars) : [];
  const key = cacheAware ? conversationKey(affinity, prefixHashes) : affinity;
  return {
    config,
    version: snapshot.version,
    keySource: key?.source ?? null,
    prefixBlocks: prefixHashes.length,
    request: { version: snapshot.version, model, key: key?.hash ?? null, prefixHashes, tokens: Math.ceil(bodyChars / 4), dryRun },
  };
}

export function selectionFailure(error: SelectionError | { kind: "stale_view" }): RouterError {
  switch (error.kind) {
    case "no_nodes":
      return new RouterError(503, `No ${error.role} node is configured for this request.`, "service_unavailable", "no_nodes_available");
    case "no_decode_in_group":
      return new RouterError(503, error.message, "service_unavailable", "no_decode_in_group");
    case "stale_view":
      return new RouterError(503, "The cluster state did not take the cluster document.", "service_unavailable", "cluster_state_unavailable");
  }
}

function upstreamNode(env: Env, node: NodeConfig): UpstreamNode {
  const secret = node.apiKeySecret ? env[node.apiKeySecret] : undefined;
  return { id: node.id, url: node.url, bootstrapPort: node.bootstrapPort, token: typeof secret === "string" && secret ? secret : null };
}

/** Maps a leg that failed before the client saw anything to the client's error (the router's own words, except a refused request's reason). */
export function upstreamError(f: UpstreamFailure): RouterError {
  if (f.outcome === "client_error" && f.status !== null) {
    return new RouterError(f.status as 400, f.clientMessage ?? `The ${f.leg} node rejected the request (HTTP ${f.status}).`, "invalid_request_error", "upstream_rejected");
  }
  if (f.kind === "timeout") return new RouterError(504, `The ${f.leg} node did not answer in time: ${f.message}.`, "upstream_error", "upstream_timeout");
  if (f.kind === "aborted") return new RouterError(499 as 400, "The request ended before the nodes answered.", "upstream_error", "client_closed_request");
  return new RouterError(502, `The ${f.leg} node failed: ${f.message}.`, "upstream_error", "upstream_unavailable");
}

function serverTiming(routeMs: number, prefillMs: number, decodeMs: number): string {
  return `route;dur=${routeMs}, prefill;dur=${prefillMs}, decode-ttfb;dur=${decodeMs}`;
}

/** The stream carries a usage object only when the client asked for one. */
function streamHasUsage(parsed: Record<string, unknown>): boolean {
  const o = parsed.stream_options as { include_usage?: unknown; continuous_usage_stats?: unknown } | null | undefined;
  return Boolean(o && (o.include_usage || o.continuous_usage_stats));
}

/** POST /v1/chat/completions and /v1/completions: route, run the legs, answer from D. */
export async function forwardInference(c: Ctx, kind: RequestKind, route: string): Promise<Response> {
  const requestId = c.get("requestId");
  const raw = await c.req.text();
  const body = parseInferenceRequest(raw, kind);
  const { config, version, request, keySource } = await buildRouteRequest(c, kind, body, raw.length, false);
  request.route = route;
  const env = c.env;
  const ttlMs = intVar(env.LEASE_TTL_MS, DEFAULT_LEASE_TTL_MS);
  const life = new RequestLife({
    state: clusterState(env),
    waitUntil: (p) => background(c, p, requestId),
    requestId,
    route,
    model: body.model,
    policy: `${config.policy.prefill}/${config.policy.decode}`,
    keyHash: request.key,
    keySource,
    keyLabel: c.get("keyLabel"),
    trace: traceContext(c.req.header("traceparent"), c.req.header("tracestate")),
    clientSignal: c.req.raw.signal,
    renewMs: Math.max(10, Math.floor(ttlMs / 3)),
  });
  const fail = (err: unknown): never => {
    const error =
      err instanceof RouterError ? err : err instanceof UpstreamFailure ? upstreamError(err) : new RouterError(502, "The upstream request failed.", "upstream_error", "upstream_unavailable");
    const legs: Ending["legs"] = {};
    if (err instanceof UpstreamFailure && !wasReported(err)) legs[err.leg] = err.report();
    life.end({ status: error.status, outcome: error.code === "client_closed_request" ? "aborted" : "error", error: error.message, legs });
    error.counted = true;
    throw error;
  };

  let answer: DecodeAnswer;
  try {
    const routed = await life.route(request, clusterView(config, version));
    if (!routed.ok) throw selectionFailure(routed.error);
    if (config.protocol === "colocated") life.prefillReported = true;
    const nodes = new Map(config.nodes.map((n) => [n.id, n]));
    const ctx: ForwardContext = {
      raw,
      parsed: body,
      path: route,
      stream: body.stream === true,
      life,
      timeouts: config.timeouts,
      retries: RETRIES,
      resolve: (id) => upstreamNode(env, nodes.get(id)!),
      sleep: (ms) => new Promise((r) => setTimeout(r, ms)),
    };
    answer = await PROTOCOLS[config.protocol](ctx);
  } catch (err) {
    return fail(err);
  }

  life.timings.decodeMs = answer.decodeMs;
  if (answer.prefillMs) life.timings.prefillMs = answer.prefillMs;
  const headers = new Headers({
    "x-request-id": requestId,
    "x-pd-prefill": answer.prefillNode,
    "x-pd-decode": answer.decodeNode,
    "server-timing": serverTiming(life.timings.routeMs ?? 0, answer.prefillMs, answer.decodeMs),
  });
  if (life.failOpen.length) {
    headers.set("x-pd-fail-open", life.failOpen.join(","));
    console.warn(JSON.stringify({ event: "fail_open", requestId, roles: life.failOpen }));
  }
  const decodeLeg = (outcome: LegReport["outcome"]): LegReport => ({ node: answer.decodeNode, outcome, ms: answer.decodeMs });
  const fix = answer.prefillUsage ? fixUsage(answer.prefillUsage) : null;
  life.responding();

  if (answer.body.kind === "json") {
    const text = fix ? fixUsageInBody(answer.body.text, fix) : answer.body.text;
    headers.set("content-type", "application/json");
    life.end({ status: 200, outcome: "ok", legs: { decode: decodeLeg("ok") } });
    return new Response(text, { status: 200, headers });
  }

  headers.set("content-type", "text/event-stream; charset=utf-8");
  headers.set("cache-control", "no-cache");
  const onEnd = (end: StreamEnd) => {
    switch (end.outcome) {
      case "ok":
        return life.end({ status: 200, outcome: "ok", legs: { decode: decodeLeg("ok") } });
      case "failure":
        return life.end({ status: 502, outcome: "error", error: end.error, legs: { decode: decodeLeg("failure") } });
      case "aborted":
      case "stalled":
        return life.end({ status: 499, outcome: end.outcome, error: end.error, legs: { decode: decodeLeg("aborted") } });
    }
  };
  const stream = relayStream({
    leg: answer.leg,
    reader: answer.body.reader,
    first: answer.body.first,
    rewriter: fix && streamHasUsage(body) ? sseUsageRewriter(fix) : null,
    idleMs: config.timeouts.decodeIdleMs,
    stallMs: intVar(env.CLIENT_STALL_MS, DEFAULT_CLIENT_STALL_MS),
    onEnd,
  });
  return new Response(stream, { status: 200, headers });
}

/** POST /v1/route: the decision this body would get, nothing forwarded, no lease taken. */
export async function explainRoute(c: Ctx, raw: string): Promise<Response> {
  // The body is the one the client would send: chat when it has top-level messages.
  const kind = requestKindOf(raw);
  const body = parseInferenceRequest(raw, kind);
  const { config, version, request, keySource, prefixBlocks } = await buildRouteRequest(c, kind, body, raw.length, true);
  const state = clusterState(c.env);
  const view = clusterView(config, version);
  const [routed, snapshot] = await Promise.all([state.route({ ...request, cluster: view }), state.snapshot()]);
  if (!routed.ok) throw selectionFailure(routed.error);
  const d: Decision = routed.decision;
  const summary = (role: Role) => ({ id: d[role].id, rule: d[role].rule, failOpen: d[role].failOpen, fallbacks: d[role].fallbacks });
  return c.json({
    protocol: config.protocol,
    policy: config.policy,
    prefill: summary("prefill"),
    decode: summary("decode"),
    key: { source: keySource, hash: request.key, prefixBlocks },
    rule: { prefill: d.prefill.rule, decode: d.decode.rule },
    candidates: { prefill: d.prefill.candidates, decode: d.decode.candidates },
    // health, breaker, failures and in-flight load of every node, as the Durable Object sees them
    nodes: snapshot.nodes.map(({ id, healthy, probeUp, breaker, ejectedUntil, failureStreak, failuresTotal, inflight, drain }) => ({
      id,
      healthy,
      probeUp,
      breaker,
      ejectedUntil,
      failureStreak,
      failuresTotal,
      inflight,
      drain,
    })),
  });
}

function requestKindOf(raw: string): RequestKind {
  try {
    const value: unknown = JSON.parse(raw);
    if (value && typeof value === "object" && !("messages" in value) && "prompt" in value) return "completion";
  } catch {
    // parseInferenceRequest reports the bad JSON
  }
  return "chat";
}
