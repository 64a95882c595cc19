import type { Context } from "hono";
import { clusterState, clusterView, currentConfig, requireConfig, servesModel } from "../config/runtime";
import type { ClusterConfig, NodeConfig } from "../config/schema";
import type { Env } from "../env";
import { RouterError } from "../errors";
import { forwardColocated } from "../forward/colocated";
import { wasReported, type ForwardContext, type ForwardResult } from "../forward/pipeline";
import { forwardSglang } from "../forward/sglang";
import { observeStream, rewriteUsageLine, setCachedTokens, type StreamEnd } from "../forward/stream";
import { UpstreamFailure, type UpstreamNode } from "../forward/upstream";
import { forwardVllm } from "../forward/vllm";
import { affinityKey, conversationKey } from "../routing/affinity-key";
import { canonicalPromptText, prefixBlockHashes } from "../routing/prefix-blocks";
import type { Decision, Role, SelectionError } from "../routing/types";
import type { FinishReport, LegReport, RouteRequest } from "../state/types";
import { background, logRequest } from "../observability/log";
import { parseInferenceRequest, type InferenceRequest, type RequestKind } from "./request-schema";

export type AppEnv = { Bindings: Env; Variables: { requestId: string; keyLabel?: string } };
type Ctx = Context<AppEnv>;

const PROTOCOLS = { vllm: forwardVllm, sglang: forwardSglang, colocated: forwardColocated } as const;
/** failover attempts after the first, per leg */
const RETRIES = 2;

const KEYED_POLICIES = new Set(["affinity", "cache_aware", "least_load"]);

/** Everything the Durable Object needs to decide, computed once in the Worker (hashing included). */
export async function buildRouteRequest(
  c: Ctx,
  kind: RequestKind,
  body: InferenceRequest,
  /** characters of the body as sent: the lease's token estimate (about 4 a token) */
  bodyChars: number,
  dryRun: boolean,
): Promise<{ config: ClusterConfig; request: RouteRequest; keySource: string | null; prefixBlocks: number }> {
  const snapshot = await currentConfig(c.env);
  const config = requireConfig(snapshot);
  const model = body.model;
  const colocated = config.protocol === "colocated";
  const serving = (role: Role) => config.nodes.some((n) => servesModel(n, model) && (n.role === role || n.role === "both"));
  if (!serving("decode") || (!colocated && !serving("prefill"))) {
    throw new RouterError(404, `The model '${model}' does not exist or no node serves it.`, "not_found_error", "model_not_found", "model");
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
    keySource: key?.source ?? null,
    prefixBlocks: prefixHashes.length,
    request: {
      cluster: clusterView(config, snapshot.version),
      model,
      key: key?.hash ?? null,
      prefixHashes,
      tokens: Math.ceil(bodyChars / 4),
      dryRun,
    },
  };
}

export function selectionFailure(error: SelectionError): RouterError {
  switch (error.kind) {
    case "no_nodes":
      return new RouterError(503, `No ${error.role} node is configured for this request.`, "service_unavailable", "no_nodes_available");
    case "no_decode_in_group":
      return new RouterError(503, error.message, "service_unavailable", "no_decode_in_group");
  }
}

function upstreamNode(env: Env, node: NodeConfig): UpstreamNode {
  const secret = node.apiKeySecret ? env[node.apiKeySecret] : undefined;
  return { id: node.id, url: node.url, bootstrapPort: node.bootstrapPort, token: typeof secret === "string" && secret ? secret : null };
}

/** Maps a leg that failed before the client saw anything to the client's error. */
export function upstreamError(f: UpstreamFailure): RouterError {
  if (f.outcome === "client_error" && f.status !== null) {
    // The node rejected the request itself: its message is the useful one.
    let message = `The ${f.leg} node rejected the request (${f.status}).`;
    try {
      const body = JSON.parse(f.body ?? "") as { error?: { message?: unknown } | string; message?: unknown };
      const m = typeof body.error === "string" ? body.error : (body.error?.message ?? body.message);
      if (typeof m === "string" && m) message = m;
    } catch {
      // not JSON: keep the generic message
    }
    return new RouterError(f.status as 400, message, "invalid_request_error", "upstream_rejected");
  }
  if (f.kind === "timeout") return new RouterError(504, f.message, "upstream_error", "upstream_timeout");
  return new RouterError(502, f.message, "upstream_error", f.kind === "aborted" ? "client_closed_request" : "upstream_unavailable");
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

function serverTiming(routeMs: number, prefillMs: number, decodeMs: number): string {
  return `route;dur=${routeMs}, prefill;dur=${prefillMs}, decode-ttfb;dur=${decodeMs}`;
}

/** POST /v1/chat/completions and /v1/completions: route, run the legs, stream D back. */
export async function forwardInference(c: Ctx, kind: RequestKind): Promise<Response> {
  const started = Date.now();
  const requestId = c.get("requestId");
  const raw = await c.req.text();
  const body = parseInferenceRequest(raw, kind);
  const { config, request, keySource } = await buildRouteRequest(c, kind, body, raw.length, false);
  const state = clusterState(c.env);
  const path = new URL(c.req.url).pathname;
  const waitUntil = (p: Promise<unknown>) => background(c, p, requestId);
  // The lease id is ours, so a client that leaves while any await below is pending (workerd
  // may then never resume this handler) still gets its lease released, exactly once.
  const leaseId = crypto.randomUUID();
  let finished = false;
  let decision: Decision | null = null;
  const timings: { routeMs?: number; prefillMs?: number; decodeMs?: number } = {};
  const chosen = { prefill: "", decode: "" };
  let failOpen: Role[] = [];
  const finish = (status: number, legs: { prefill?: LegReport; decode?: LegReport }, outcome: string, error?: string) => {
    if (finished) return;
    finished = true;
    const keyLabel = c.get("keyLabel");
    const report: FinishReport = { route: path, status, ...legs, ...(keyLabel ? { keyLabel } : {}) };
    waitUntil(state.finish(leaseId, report));
    logRequest({
      requestId,
      route: path,
      model: body.model,
      policy: `${config.policy.prefill}/${config.policy.decode}`,
      prefill: chosen.prefill || undefined,
      decode: chosen.decode || undefined,
      keyHash: request.key?.slice(0, 16) ?? null,
      keySource,
      rule: decision ? `${decision.prefill.rule}/${decision.decode.rule}` : undefined,
      status,
      outcome,
      routeMs: timings.routeMs,
      prefillMs: timings.prefillMs,
      decodeTtfbMs: timings.decodeMs,
      totalMs: Date.now() - started,
      failOpen: failOpen.length ? failOpen : undefined,
      error,
    });
  };
  c.req.raw.signal.addEventListener(
    "abort",
    () => {
      // "aborted" tells nothing about the nodes' health, but frees a half-open trial they hold.
      const legs: { prefill?: LegReport; decode?: LegReport } = {};
      if (chosen.decode) legs.decode = { node: chosen.decode, outcome: "aborted" };
      if (chosen.prefill && chosen.prefill !== chosen.decode) legs.prefill = { node: chosen.prefill, outcome: "aborted" };
      finish(499, legs, "aborted", "client disconnected");
    },
    { once: true },
  );

  const routed = await state.route({ ...request, leaseId });
  if (!routed.ok) {
    const error = selectionFailure(routed.error);
    finish(error.status, {}, "error", error.message);
    throw error;
  }
  decision = routed.decision;
  timings.routeMs = Date.now() - started;
  chosen.prefill = decision.prefill.id;
  chosen.decode = decision.decode.id;
  failOpen = (["prefill", "decode"] as const).filter((r) => decision![r].failOpen);
  const nodes = new Map(config.nodes.map((n) => [n.id, n]));
  let prefillReported = config.protocol === "colocated";

  const ctx: ForwardContext = {
    raw,
    parsed: body,
    path,
    requestId,
    signal: c.req.raw.signal,
    timeouts: config.timeouts,
    retries: RETRIES,
    chosen,
    resolve: (id) => upstreamNode(c.env, nodes.get(id)!),
    failover: async (role, report, wantNext) => (await state.failover(leaseId, role, report, wantNext)).next,
    prefillDone: (report) => {
      prefillReported = true;
      waitUntil(state.prefillDone(leaseId, report));
    },
    sleep: (ms) => new Promise((r) => setTimeout(r, ms)),
  };
  let result: ForwardResult;
  try {
    result = await PROTOCOLS[config.protocol](ctx);
  } catch (err) {
    const legs: { prefill?: LegReport; decode?: LegReport } = {};
    let error = err instanceof RouterError ? err : new RouterError(502, "The upstream request failed.", "upstream_error", "upstream_unavailable");
    if (err instanceof UpstreamFailure) {
      error = upstreamError(err);
      if (!wasReported(err)) legs[err.leg] = err.report();
    }
    // A P that never answered still holds its part of the lease: finish releases it.
    if (!prefillReported && !legs.prefill) legs.prefill = { node: ctx.chosen.prefill, outcome: "aborted" };
    finish(error.status, legs, "error", error.message);
    throw error;
  }

  const headers = new Headers({
    "x-request-id": requestId,
    "x-pd-prefill": result.prefillNode,
    "x-pd-decode": result.decodeNode,
    "server-timing": serverTiming(timings.routeMs, result.prefillMs, result.decodeMs),
  });
  timings.prefillMs = result.prefillMs;
  timings.decodeMs = result.decodeMs;
  if (failOpen.length) {
    headers.set("x-pd-fail-open", failOpen.join(","));
    console.warn(JSON.stringify({ event: "fail_open", requestId, roles: failOpen }));
  }
  const upstream = result.decode.response;
  const contentType = upstream.headers.get("content-type") ?? "application/json";
  headers.set("content-type", contentType);
  const sse = contentType.includes("text/event-stream");
  if (sse) headers.set("cache-control", "no-cache");
  const decodeLeg = (outcome: LegReport["outcome"]): LegReport => ({ node: result.decodeNode, outcome, ms: result.decodeMs });
  const prefillSettled = result.prefillSettled ?? Promise.resolve(null);

  // Non-streamed vLLM answers carry P's cached_tokens: the body is one small JSON object.
  if (!sse && result.cachedTokens !== null) {
    const text = await upstream.text();
    let out = text;
    try {
      const json = JSON.parse(text) as Record<string, unknown>;
      if (setCachedTokens(json, result.cachedTokens)) out = JSON.stringify(json);
    } catch {
      // not JSON: pass it on as it is
    }
    finish(upstream.status, { decode: decodeLeg("ok") }, "ok");
    return new Response(out, { status: upstream.status, headers });
  }

  const onEnd = (end: StreamEnd) =>
    prefillSettled.then((prefill) => {
      const status = end.outcome === "ok" ? upstream.status : end.outcome === "aborted" ? 499 : 502;
      const legs: { prefill?: LegReport; decode?: LegReport } = { decode: decodeLeg(end.outcome) };
      if (prefill) legs.prefill = prefill;
      finish(status, legs, end.outcome, end.outcome === "failure" ? end.error : undefined);
    });
  const streamed = observeStream(upstream.body ?? new ReadableStream(), {
    sse,
    rewriteLine: sse && result.cachedTokens !== null ? rewriteUsageLine(result.cachedTokens) : undefined,
    onEnd,
    abortUpstream: (reason) => result.decode.abort(reason),
  });
  waitUntil(streamed.done);
  return new Response(streamed.body, { status: upstream.status, headers });
}

/** POST /v1/route: the decision this body would get, nothing forwarded, no lease taken. */
export async function explainRoute(c: Ctx, raw: string): Promise<Response> {
  // The body is the one the client would send: chat when it has top-level messages.
  const kind = requestKindOf(raw);
  const body = parseInferenceRequest(raw, kind);
  const { config, request, keySource, prefixBlocks } = await buildRouteRequest(c, kind, body, raw.length, true);
  const state = clusterState(c.env);
  const [routed, snapshot] = await Promise.all([state.route(request), state.snapshot()]);
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

