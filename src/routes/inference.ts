import type { Context } from "hono";
import { clusterState, clusterView, currentConfig, invalidateConfig, numberVar, requireConfig, servesModel } from "../config/runtime";
import type { ClusterConfig, NodeConfig, Protocol } from "../config/schema";
import { poolFor } from "../config/pools";
import { nodesPointingAt } from "../config/self-origin";
import type { Env } from "../env";
import { badRequest, RouterError } from "../errors";
import { forwardColocated } from "../forward/colocated";
import { notifiesPItself } from "../forward/handle-release";
import { forwardLocalPrefill } from "../forward/local-prefill";
import { jsonAnswerUsage, usageObserver, type AnswerUsage } from "../forward/usage-watch";
import { RequestLife, type Ending } from "../forward/lifecycle";
import { wasReported, type DecodeAnswer, type ForwardContext } from "../forward/pipeline";
import { forwardSglang } from "../forward/sglang";
import { fixUsage, fixUsageInBody, usageRewrite } from "../forward/stream";
import { decodeSource, type DecodeSource, type StreamEnd } from "../forward/decode-source";
import { clientStream, singleFeed } from "../forward/client-stream";
import type { Completeness } from "../forward/sse-reader";
import { apiKeys, chargeRateLimit, type ClientKey } from "../auth/client-access";
import { bearerToken } from "../auth/bearer";
import { keyLabel } from "../auth/digest";
import { requestTier, tierOf } from "../auth/service-tier";
import { vllmPriorityOf } from "../forward/priority";
import { nodeAccess } from "../config/node-access";
import { UpstreamFailure, type UpstreamNode } from "../forward/upstream";
import { forwardVllm } from "../forward/vllm";
import { forwardVllmMooncake } from "../forward/vllm-mooncake";
import { affinityKey, agentSessionOf, conversationKey } from "../routing/affinity-key";
import { canonicalPromptText, prefixBlockHashes, promptCharCount } from "../routing/prefix-blocks";
import type { Decision, Role, SelectionError } from "../routing/types";
import { DEFAULT_LEASE_TTL_MS } from "../state/cluster-state";
import { BUSY_RETRY_DEFAULT_MS } from "../state/health-table";
import type { AdmissionError, ClusterView, LegReport, RouteRequest } from "../state/types";
import { background } from "../observability/log";
import { traceContext } from "../observability/trace";
import { editMembers } from "../forward/json-text";
import { sha256Hex } from "../routing/hash";
import { responseKeyMaterial } from "../routing/affinity-key";
import { batchFeed, MAX_BATCH_PROMPTS, mergeCompletions, type CompletionObject } from "../forward/batch";
import { checkInferenceRequest, parseInferenceRequest, parseJsonObject, type InferenceRequest, type RequestKind } from "./request-schema";

export type AppEnv = { Bindings: Env; Variables: { requestId: string; keyLabel?: string; rateLimitKey?: string; clientKey?: ClientKey } };
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

/** How long a write to the client may wait before the client counts as gone (it left before the response, or stopped reading). */
export const DEFAULT_CLIENT_STALL_MS = 10_000;

const positive = (n: number) => n > 0;

/** Everything the Durable Object needs to decide, computed once in the Worker (hashing included). */
export async function buildRouteRequest(
  c: Ctx,
  kind: RequestKind,
  body: InferenceRequest,
  /** characters of the body as sent: the lease's token estimate (about 4 a token) */
  bodyChars: number,
  dryRun: boolean,
  /** one node, no disaggregation and no affinity key (embeddings, tokenizer) */
  oneHop = false,
): Promise<{ config: ClusterConfig; view: ClusterView; pool: string; request: RouteRequest; keySource: string | null; prefixBlocks: number; configStateCalls: number }> {
  const configCalls = { calls: 0 };
  const snapshot = await currentConfig(c.env, configCalls);
  const config = requireConfig(snapshot);
  const model = typeof body.model === "string" ? body.model : "";
  const colocated = config.protocol === "colocated" || oneHop;
  const serving = (role: Role) => config.nodes.some((n) => (!model || servesModel(n, model)) && (n.role === role || n.role === "both"));
  if (!serving("decode") || (!colocated && !serving("prefill"))) {
    throw new RouterError(404, `The model '${model}' does not exist or no node serves it.`, "not_found_error", "model_not_found", "model");
  }
  const looping = loopingNodes(config, c.req.url);
  if (looping.length) {
    throw new RouterError(508, `Node(s) ${looping.join(", ")} point at the router itself.`, "server_error", "routing_loop");
  }
  const policy = config.policy;
  // A turn that continues a stored response needs the nodes that stored it, whatever the policy.
  const pinned = kind === "responses" && typeof body.previous_response_id === "string" && body.previous_response_id !== "";
  const keyed = pinned || (!oneHop && (KEYED_POLICIES.has(policy.prefill) || KEYED_POLICIES.has(policy.decode)));
  const affinity = keyed
    ? await affinityKey({ sessionId: c.req.header("x-session-id") ?? null, agentSessionId: agentSessionOf((name) => c.req.header(name)), tenant: await tenantOf(c), body, kind })
    : null;
  const cacheAware = !oneHop && (policy.prefill === "cache_aware" || policy.decode === "cache_aware");
  // conditional and predicted disaggregation ask how much of the prompt D (and P) hold: the prefix blocks, whatever the policy
  const conditional = !colocated && (policy.disaggregation === "conditional" || policy.disaggregation === "predicted");
  // Only cache_aware and conditional need the prompt rendered as one string and hashed; the rest
  // of the policies pay for its length alone (requests are weighed by their tokens).
  const text = cacheAware || conditional ? canonicalPromptText(body, kind) : null;
  const prefixHashes = text !== null ? await prefixBlockHashes(text, policy.cacheAware.blockChars) : [];
  const promptChars = oneHop ? 0 : text !== null ? text.length : promptCharCount(body, kind);
  const key = cacheAware ? conversationKey(affinity, prefixHashes) : affinity;
  // SPEC 9: its band in the edge queue (the body's service_tier, validated by the request schema,
  // capped by the key's tier) and whose fair share it counts against
  const clientKey = c.get("clientKey");
  const tier = requestTier(tierOf(body.service_tier), clientKey?.tier ?? null);
  // the object of the pool that serves this model (one for the whole cluster unless model sets are disjoint)
  const pool = poolFor(config, model);
  const view = clusterView(config, snapshot.version, pool);
  return {
    config,
    view,
    pool: pool.key,
    keySource: key?.source ?? null,
    prefixBlocks: prefixHashes.length,
    configStateCalls: configCalls.calls,
    request: {
      version: view.version,
      model,
      key: key?.hash ?? null,
      prefixHashes,
      tokens: Math.ceil(bodyChars / 4),
      promptChars,
      dryRun,
      ...(oneHop ? { oneHop } : {}),
      ...(pinned ? { pinned } : {}),
      ...(tier !== "default" ? { tier } : {}),
      ...(clientKey ? { flow: clientKey.label } : {}),
    },
  };
}

/**
 * The API key label a client-chosen affinity key is hashed with (SPEC 9). The auth middleware sets
 * it only on the routes that count keys in their finish report; /v1/responses and /v1/route derive
 * it here from the key it already checked, so a dry run names the key a real request gets.
 */
async function tenantOf(c: Ctx): Promise<string | null> {
  const label = c.get("keyLabel");
  if (label) return label;
  if (apiKeys(c.env).length === 0) return null;
  const token = bearerToken(c.req.header("authorization"));
  return token === null ? null : keyLabel(token);
}

/** Per document: node ids by origin, so the loop check costs one lookup a request. */
const nodeOrigins = new WeakMap<ClusterConfig, Map<string, string[]>>();

/** Nodes whose URL is the router's own origin (nodesPointingAt, computed once per document). */
function loopingNodes(config: ClusterConfig, requestUrl: string): string[] {
  let origins = nodeOrigins.get(config);
  if (!origins) {
    origins = new Map();
    for (const origin of new Set(config.nodes.map((n) => new URL(n.url).origin))) origins.set(origin, nodesPointingAt(config, origin));
    nodeOrigins.set(config, origins);
  }
  return origins.get(new URL(requestUrl).origin) ?? [];
}

/**
 * The request waited through a document edit and was decided under the newer version: this
 * isolate reads the document again. Its own still serves when it names the chosen nodes (KV not
 * yet showing the edit here); otherwise the lease goes back and the client may retry at once.
 */
async function configOfVersion(env: Env, config: ClusterConfig, model: string, version: string, chosen: string[]): Promise<ClusterConfig> {
  invalidateConfig();
  const fresh = await currentConfig(env);
  if (fresh.config && clusterView(fresh.config, fresh.version, poolFor(fresh.config, model)).version === version) return fresh.config;
  if (chosen.every((id) => config.nodes.some((n) => n.id === id))) return config;
  throw new RouterError(503, "The cluster document changed while the request waited; retry.", "service_unavailable", "cluster_state_unavailable", null, { "retry-after": "1" });
}

/** Per document: its nodes by id. */
const nodesById = new WeakMap<ClusterConfig, Map<string, NodeConfig>>();

export function selectionFailure(error: SelectionError | { kind: "stale_view" } | AdmissionError): RouterError {
  switch (error.kind) {
    case "decode_busy":
    case "cluster_busy": {
      const why =
        error.kind !== "cluster_busy" || error.reason === "timeout"
          ? "none freed up in time"
          : error.reason === "shed"
            ? "a request of a higher service tier took this one's place"
            : "the queue is full";
      const retryAfter = error.kind === "cluster_busy" ? error.retryAfterS : 1;
      return new RouterError(503, `Every decode node is busy and ${why}.`, "service_unavailable", "cluster_busy", null, {
        "retry-after": String(retryAfter),
      });
    }
    case "fair_share_exceeded":
      return new RouterError(429, "Your API key holds more than its share of the requests waiting for a decode node.", "rate_limit_error", "fair_share_exceeded", null, {
        "retry-after": String(error.retryAfterS),
      });
    case "slo_unmeetable":
      return new RouterError(
        503,
        `A flex request's predicted time to first token is about ${error.predictedMs} ms, beyond admission.ttftSloMs.`,
        "service_unavailable",
        "slo_unmeetable",
        null,
        {
          "retry-after": String(error.retryAfterS),
        },
      );
    case "client_gone":
      return new RouterError(499 as 503, "The request ended while it waited for a decode node.", "upstream_error", "client_closed_request");
    case "no_nodes":
      return new RouterError(503, `No ${error.role} node for this request.`, "service_unavailable", "no_nodes_available");
    case "no_decode_in_group":
      return new RouterError(503, error.message, "service_unavailable", "no_decode_in_group");
    case "stale_view":
      return new RouterError(503, "The cluster state refused the cluster document.", "service_unavailable", "cluster_state_unavailable");
  }
}

function upstreamNode(env: Env, node: NodeConfig): UpstreamNode {
  return { id: node.id, url: node.url, bootstrapPort: node.bootstrapPort, bootstrapHost: node.bootstrapHost, access: nodeAccess(env, node) };
}

/** Maps a leg that failed before the client saw anything to the client's error (the router's own words, except a refused request's reason). */
export function upstreamError(f: UpstreamFailure): RouterError {
  if (f.outcome === "client_error" && f.status !== null) {
    return new RouterError(f.status as 400, f.clientMessage ?? `The ${f.leg} node rejected the request (HTTP ${f.status}).`, "invalid_request_error", "upstream_rejected");
  }
  if (f.outcome === "busy") {
    // every node tried was full: the client may come back when the soonest of them said it could
    const seconds = Math.max(1, Math.ceil((f.retryAfterMs ?? BUSY_RETRY_DEFAULT_MS) / 1000));
    return new RouterError(503, `Every ${f.leg} node tried is busy: ${f.message}.`, "service_unavailable", "upstream_busy", null, { "retry-after": String(seconds) });
  }
  if (f.kind === "timeout") return new RouterError(504, `The ${f.leg} node did not answer in time: ${f.message}.`, "upstream_error", "upstream_timeout");
  if (f.kind === "aborted") return new RouterError(499 as 400, "The request ended before the nodes answered.", "upstream_error", "client_closed_request");
  return new RouterError(502, `The ${f.leg} node failed: ${f.message}.`, "upstream_error", "upstream_unavailable");
}

function serverTiming(routeMs: number, prefillMs: number, decodeMs: number, queueMs?: number): string {
  const queue = queueMs === undefined ? "" : `queue;dur=${queueMs}, `;
  return `${queue}route;dur=${routeMs}, prefill;dur=${prefillMs}, decode-ttfb;dur=${decodeMs}`;
}

/** The stream carries a usage object only when the client asked for one (a Responses stream always does). */
function streamHasUsage(kind: RequestKind, parsed: Record<string, unknown>): boolean {
  if (kind === "responses") return true;
  const o = parsed.stream_options as { include_usage?: unknown; continuous_usage_stats?: unknown } | null | undefined;
  return Boolean(o && (o.include_usage || o.continuous_usage_stats));
}

/** One routed request (or one prompt of a split batch) up to D's answer. */
interface Routed {
  life: RequestLife;
  config: ClusterConfig;
  answer: DecodeAnswer;
}

/**
 * Responses API requests the cluster cannot serve, refused before anything is sent:
 * - `background: true`: vLLM runs it in a task on the one node that got it and serves
 *   GET /v1/responses/{id} and /cancel from that node's memory; the router's request (its lease,
 *   its load) would end at once while the generation runs on, unaccounted. Stream instead.
 * - protocol sglang: SGLang's /v1/responses handler builds the engine request without the
 *   bootstrap fields (sgl-project/sglang python/sglang/srt/entrypoints/openai/serving_responses.py
 *   `create_responses`: GenerateReqInput(input_ids, sampling_params, stream, rid, ...)), so P and
 *   D would never meet, and a decode-mode SGLang server cannot prefill alone.
 */
export function refuseUnservableResponse(protocol: Protocol, body: InferenceRequest): void {
  if ((body as { background?: unknown }).background === true) {
    throw badRequest("background: true is not supported (it would run outside the router); stream instead.", "background", "unsupported_parameter");
  }
  if (protocol === "sglang") {
    throw new RouterError(
      400,
      "The Responses API is not routed under protocol sglang (SGLang gives it no bootstrap fields); use /v1/chat/completions.",
      "invalid_request_error",
      "unsupported_for_protocol",
    );
  }
}

/** Routes one body and runs its protocol until D answered; ends the request's life on failure. `onLife`: the life, as soon as it exists. */
async function route(
  c: Ctx,
  kind: RequestKind,
  path: string,
  raw: string,
  body: InferenceRequest,
  requestId: string,
  oneHop = false,
  onLife?: (life: RequestLife) => void,
): Promise<Routed> {
  let { config, view, pool, request, keySource, configStateCalls } = await buildRouteRequest(c, kind, body, raw.length, false, oneHop);
  if (kind === "responses") refuseUnservableResponse(config.protocol, body);
  request.route = path;
  const env = c.env;
  const ttlMs = numberVar(env.LEASE_TTL_MS, DEFAULT_LEASE_TTL_MS, positive);
  const life = new RequestLife({
    state: clusterState(env, pool),
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
  });
  onLife?.(life);
  life.waitedForState(configStateCalls);
  try {
    // while it waits at the edge: this isolate's document, for the object to see an edit
    const refresh = async (): Promise<ClusterView | null> => {
      const fresh = await currentConfig(env);
      const p = fresh.config ? poolFor(fresh.config, body.model) : null;
      return fresh.config && p?.key === pool ? clusterView(fresh.config, fresh.version, p) : null;
    };
    let routed = await life.route(request, view, refresh);
    if (!routed.ok && routed.error.kind === "stale_view") {
      // the object holds a document this isolate read before: read it again and route once more
      invalidateConfig();
      ({ config, view, request } = await buildRouteRequest(c, kind, body, raw.length, false, oneHop));
      request.route = path;
      routed = await life.route(request, view, refresh);
    }
    if (!routed.ok) throw selectionFailure(routed.error);
    if (routed.version && routed.version !== view.version)
      config = await configOfVersion(env, config, body.model, routed.version, [routed.decision.prefill.id, routed.decision.decode.id]);
    if (config.protocol === "colocated" || oneHop) life.prefillReported = true;
    let nodes = nodesById.get(config);
    if (!nodes) {
      nodes = new Map(config.nodes.map((n) => [n.id, n]));
      nodesById.set(config, nodes);
    }
    const ctx: ForwardContext = {
      raw,
      parsed: body,
      path,
      // one-hop routes never stream (forwardOneHop refuses `stream`)
      stream: !oneHop && body.stream === true,
      life,
      timeouts: config.timeouts,
      retries: RETRIES,
      resolve: (id) => upstreamNode(env, nodes!.get(id)!),
      // SPEC 9: vLLM's own `priority` from the tier, on nodes that run its priority scheduling
      priorityOf: (id) => (nodes!.get(id)?.priorityScheduling === true ? vllmPriorityOf(request.tier ?? "default") : undefined),
      decodeNotifiesP: (id) => notifiesPItself(nodes!.get(id)?.vllmVersion),
      sleep: (ms) => new Promise((r) => setTimeout(r, ms)),
    };
    // conditional disaggregation may have D prefill alone: no P leg, D's body without a handle
    const disaggregated = PROTOCOLS[config.protocol];
    const forward = oneHop ? forwardColocated : life.isLocalPrefill ? (x: ForwardContext) => forwardLocalPrefill(x, disaggregated) : disaggregated;
    const answer = await forward(ctx);
    if (!oneHop) reportPrefillUsage(life, answer);
    // P's answer when it ran first, then D's first byte: what the predicted TTFT is held against
    life.observe({ ttftMs: answer.prefillMs + answer.decodeMs });
    life.timings.decodeMs = answer.decodeMs;
    if (answer.prefillMs) life.timings.prefillMs = answer.prefillMs;
    return { life, config, answer };
  } catch (err) {
    const error =
      err instanceof RouterError
        ? err
        : err instanceof UpstreamFailure
          ? upstreamError(err)
          : new RouterError(502, "The upstream request failed.", "upstream_error", "upstream_unavailable");
    const legs: Ending["legs"] = {};
    if (err instanceof UpstreamFailure && !wasReported(err)) legs[err.leg] = err.report();
    life.end({ status: error.status, outcome: error.code === "client_closed_request" ? "aborted" : "error", error: error.message, legs });
    error.counted = true;
    throw error;
  }
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

/** The events that end a complete Responses API stream (vLLM's responses/serving.py). */
const RESPONSES_COMPLETE: Completeness = { kind: "events", types: ["response.completed", "response.incomplete", "response.failed"] };
const DONE_COMPLETE: Completeness = { kind: "done" };

const RESPONSE_ID = /"id"\s*:\s*"(resp[^"]{1,200})"/;

/** A Responses API answer's id: the key under which its nodes are remembered for `previous_response_id`. */
function rememberResponse(life: RequestLife, text: string): void {
  const id = RESPONSE_ID.exec(text)?.[1];
  if (id) life.rememberAs(sha256Hex(responseKeyMaterial(id).material));
}

/** Reads a Responses stream's opening bytes (response.created) for its id, however D's chunks split them. */
function responseIdWatcher(life: RequestLife): (bytes: Uint8Array) => void {
  const decoder = new TextDecoder();
  let seen: string | null = "";
  return (bytes) => {
    if (seen === null) return;
    seen += decoder.decode(bytes, { stream: true });
    if (RESPONSE_ID.test(seen) || seen.length > 65536) {
      rememberResponse(life, seen);
      seen = null;
    }
  };
}

/**
 * Counts a stream's SSE data events as they pass and when the first and last came: a token is an
 * event (vLLM and SGLang send one a token, or a few at a time under load, which this counts as one
 * step). One look at each byte, no decoding.
 */
function streamPace(): { events: number; first: number; last: number; watch(bytes: Uint8Array): void } {
  // "data:" at the start of a line; `atLineStart` carries across chunks
  const DATA = [0x64, 0x61, 0x74, 0x61, 0x3a];
  let atLineStart = true;
  let matched = -1;
  const pace = {
    events: 0,
    first: 0,
    last: 0,
    watch(bytes: Uint8Array) {
      let found = false;
      for (const b of bytes) {
        if (b === 0x0a) {
          atLineStart = true;
          matched = -1;
          continue;
        }
        if (atLineStart) {
          matched = 0;
          atLineStart = false;
        }
        if (matched >= 0 && b === DATA[matched]) {
          matched++;
          if (matched === DATA.length) {
            pace.events++;
            found = true;
            matched = -1;
          }
        } else matched = -1;
      }
      if (!found) return;
      const now = Date.now();
      if (pace.first === 0) pace.first = now;
      pace.last = now;
    },
  };
  return pace;
}

/** D's answer as the client's body: a whole JSON text, or D's stream as a source to relay. Ends the life when the body ends. */
function answerBody(kind: RequestKind, body: InferenceRequest, { life, config, answer }: Routed): { json: string } | { source: DecodeSource } {
  const decodeLeg = (outcome: LegReport["outcome"]): LegReport => ({ node: answer.decodeNode, outcome, ms: answer.decodeMs });
  const fix = answer.prefillUsage ? fixUsage(answer.prefillUsage) : null;
  // a node that prefilled alone (colocated, a local prefill, a pinned turn) reports its own usage
  // (one-hop answers and prompts of unknown size teach nothing: no prediction, no rate to learn)
  const alone = answer.prefillNode === answer.decodeNode && life.mode !== null && life.mode !== "disaggregated" && (life.decision?.tokens.prompt ?? 0) > 0;
  let seen: AnswerUsage | null = null;
  if (alone) life.reportEngineUsage(() => (seen ? { node: answer.decodeNode, ...seen } : null));
  life.responding();
  if (answer.body.kind === "json") {
    if (alone) seen = jsonAnswerUsage(answer.body.text);
    const text = fix ? fixUsageInBody(answer.body.text, fix) : answer.body.text;
    if (kind === "responses") rememberResponse(life, text);
    life.end({ status: 200, outcome: "ok", legs: { decode: decodeLeg("ok") } });
    return { json: text };
  }
  const onEnd = (end: StreamEnd) => {
    switch (end.outcome) {
      case "ok":
        if (pace.events > 0) life.observe({ streamEvents: pace.events, streamSpanMs: pace.last - pace.first });
        return life.end({ status: 200, outcome: "ok", legs: { decode: decodeLeg("ok") } });
      case "failure":
        // D's failure counts against D; P's (after D's first byte) against P; a request D found
        // invalid inside its stream, a busy D and a batch's failure against nobody
        return life.end({
          status: end.status ?? 502,
          outcome: "error",
          error: end.error,
          legs:
            end.blame === "decode"
              ? { decode: decodeLeg("failure") }
              : end.blame === "client"
                ? { decode: decodeLeg("client_error") }
                : end.blame === "busy"
                  ? { decode: decodeLeg("busy") }
                  : { decode: decodeLeg("aborted"), ...(end.prefill ? { prefill: end.prefill } : {}) },
        });
      case "aborted":
      case "stalled":
        return life.end({ status: 499, outcome: end.outcome, error: end.error, legs: { decode: decodeLeg("aborted") } });
    }
  };
  // its stream's usage frame, when the client asked for one, is watched (never changed)
  const watch = alone && streamHasUsage(kind, body) ? usageObserver((u) => (seen = u)) : null;
  // the stream's pace (node-rates.ts learns D's decode step from it)
  const pace = streamPace();
  const responseId = kind === "responses" ? responseIdWatcher(life) : null;
  const source = decodeSource({
    leg: answer.leg,
    reader: answer.body.reader,
    first: answer.body.first,
    rewrite: fix && (kind === "responses" || streamHasUsage(kind, body)) ? usageRewrite(fix) : watch,
    watch: (bytes) => {
      pace.watch(bytes);
      responseId?.(bytes);
    },
    idleMs: config.timeouts.decodeIdleMs,
    completeness: kind === "responses" ? RESPONSES_COMPLETE : DONE_COMPLETE,
    ...(answer.partnerFailure ? { partnerFailure: answer.partnerFailure } : {}),
    onEnd,
  });
  return { source };
}

/** The client's stream: written as fast as the client reads, cut when it stops reading for CLIENT_STALL_MS. */
function toClient(c: Ctx, feed: Parameters<typeof clientStream>[0], idleMs: number, requestId: string): ReadableStream<Uint8Array> {
  return clientStream(feed, {
    stallMs: numberVar(c.env.CLIENT_STALL_MS, DEFAULT_CLIENT_STALL_MS, positive),
    idleMs,
    // workerd drops a request's timers and I/O once its client is gone unless waitUntil holds them
    waitUntil: (p) => background(c, p, requestId),
  });
}

function answerHeaders(requestId: string, routed: Routed[]): Headers {
  const first = routed[0]!;
  const headers = new Headers({
    "x-request-id": requestId,
    "x-pd-prefill": routed.map((r) => r.answer.prefillNode).join(","),
    "x-pd-decode": routed.map((r) => r.answer.decodeNode).join(","),
    // SPEC 8 route receipt: how each request was served (for local, x-pd-prefill names D)
    "x-pd-mode": routed.map((r) => r.life.mode ?? "disaggregated").join(","),
    "server-timing": serverTiming(first.life.timings.routeMs ?? 0, first.answer.prefillMs, first.answer.decodeMs, first.life.timings.queueMs),
  });
  const failOpen = [...new Set(routed.flatMap((r) => r.life.failOpen))];
  if (failOpen.length) {
    headers.set("x-pd-fail-open", failOpen.join(","));
    console.warn(JSON.stringify({ event: "fail_open", requestId, roles: failOpen }));
  }
  return headers;
}

/** POST /v1/chat/completions, /v1/completions and /v1/responses: route, run the legs, answer from D. */
export async function forwardInference(c: Ctx, kind: RequestKind, path: string): Promise<Response> {
  const requestId = c.get("requestId");
  const raw = await c.req.text();
  const body = parseInferenceRequest(raw, kind);
  const prompts = kind === "completion" ? batchPrompts(body) : null;
  if (prompts) {
    if (prompts.length > MAX_BATCH_PROMPTS) {
      throw badRequest(`Too many prompts: ${prompts.length} (at most ${MAX_BATCH_PROMPTS}).`, "prompt", "too_many_prompts");
    }
    // the rate limiter counted one request: a batch is as many as it has prompts
    await chargeRateLimit(c.env, c.get("rateLimitKey"), prompts.length - 1);
    return forwardBatch(c, path, raw, body, prompts, requestId);
  }
  return singleResponse(c, kind, body, requestId, await route(c, kind, path, raw, body, requestId));
}

function singleResponse(c: Ctx, kind: RequestKind, body: InferenceRequest, requestId: string, routed: Routed): Response {
  const headers = answerHeaders(requestId, [routed]);
  const out = answerBody(kind, body, routed);
  if ("json" in out) {
    headers.set("content-type", "application/json");
    return new Response(out.json, { status: 200, headers });
  }
  headers.set("content-type", "text/event-stream; charset=utf-8");
  headers.set("cache-control", "no-cache");
  return new Response(toClient(c, singleFeed(out.source), routed.config.timeouts.decodeIdleMs, requestId), { status: 200, headers });
}

/**
 * One hop to a node that serves the body's model (POST /v1/embeddings, /tokenize,
 * /detokenize): no disaggregation, but the same lease, failover before the first byte, limits,
 * metrics and log line as every routed request.
 */
export async function forwardOneHop(c: Ctx, path: string, modelRequired: boolean): Promise<Response> {
  const requestId = c.get("requestId");
  const raw = await c.req.text();
  const body = parseObjectBody(raw, modelRequired);
  // These routes answer one JSON body whatever `stream` says: vLLM ignores the unknown field
  // (OpenAIBaseModel, extra="allow", vllm entrypoints/openai/protocol.py), SGLang's /tokenize
  // keeps it and answers 501 (TokenizeRequest extra="allow", OpenAIServingBase dispatching on
  // `request.stream`, sgl-project/sglang entrypoints/openai/serving_base.py). Expecting a stream,
  // or forwarding one, would blame a healthy node for the client's request.
  if (body.stream !== undefined && body.stream !== null && body.stream !== false) {
    throw badRequest(`'stream' is not supported on ${path}.`, "stream", "unsupported_parameter");
  }
  const routed = await route(c, "completion", path, raw, body, requestId, true);
  return singleResponse(c, "completion", body, requestId, routed);
}

/** POST /generate (protocol sglang): SGLang's native API, disaggregated like the OpenAI routes. */
export async function forwardGenerate(c: Ctx): Promise<Response> {
  const config = requireConfig(await currentConfig(c.env));
  if (config.protocol !== "sglang") throw new RouterError(404, "POST /generate is routed only under protocol sglang.", "not_found_error", "unknown_route");
  const requestId = c.get("requestId");
  const raw = await c.req.text();
  const body = parseObjectBody(raw, false);
  // SGLang streams on any truthy `stream` (GenerateReqInput, managers/io_struct.py): only a
  // boolean says the same thing to the router and to the engine
  if (body.stream !== undefined && typeof body.stream !== "boolean") throw badRequest("Invalid value for 'stream': must be a boolean.", "stream", "invalid_type");
  const routed = await route(c, "completion", "/generate", raw, body, requestId);
  return singleResponse(c, "completion", body, requestId, routed);
}

/** A JSON object body whose `model`, when present (or required), is a non-empty string. */
function parseObjectBody(raw: string, modelRequired: boolean): InferenceRequest {
  const value = parseJsonObject(raw);
  const model = value.model;
  if (model === undefined && modelRequired) throw badRequest("Missing required parameter: 'model'.", "model", "missing_required_parameter");
  if (model !== undefined && (typeof model !== "string" || !model)) throw badRequest("Invalid value for 'model': must be a non-empty string.", "model", "invalid_type");
  return value as InferenceRequest;
}

/** The prompts of a batched completions request (a list of several), or null for one prompt. */
function batchPrompts(body: InferenceRequest): unknown[] | null {
  const prompt = (body as { prompt?: unknown }).prompt;
  if (!Array.isArray(prompt) || prompt.length < 2) return null;
  return typeof prompt[0] === "string" || Array.isArray(prompt[0]) ? prompt : null;
}

/**
 * A batched /v1/completions: vLLM's P returns one KV handle for a whole batch, so D would give
 * prompts 2..N the first prompt's KV. Each prompt becomes its own P/D request (own lease and
 * log line, id `<request id>/<i>`), and the answers merge into one: choice indexes as the
 * engine would number them (prompt i, sample j -> i*n + j), usage summed, streams interleaved
 * in order of arrival with one [DONE], pulled at the client's pace (batchFeed). One prompt that
 * fails before the response fails the batch at once: the others' requests end with its status.
 */
async function forwardBatch(c: Ctx, path: string, raw: string, body: InferenceRequest, prompts: unknown[], requestId: string): Promise<Response> {
  const n = typeof body.n === "number" && body.n > 0 ? body.n : 1;
  const lives: RequestLife[] = [];
  let failed: RouterError | null = null;
  // their legs close now instead of running for a batch that failed (a vLLM handle is released)
  const abandon = (life: RequestLife, error: RouterError) => {
    if (!life.isEnded) life.end({ status: error.status, outcome: error.code === "client_closed_request" ? "aborted" : "error", error: "another prompt of the batch failed" });
  };
  const onLife = (life: RequestLife) => {
    lives.push(life);
    if (failed) abandon(life, failed);
  };
  // The first prompt that fails answers for the batch at once: the others' requests have ended
  // (abandon), and what they still finish — a vLLM P's answer in transit, read to its end to
  // release its handle (vllm.ts) — runs in the background, never before the client's answer.
  let failNow: () => void = () => undefined;
  const failedEarly = new Promise<null>((resolve) => {
    failNow = () => resolve(null);
  });
  const all = Promise.allSettled(
    prompts.map((prompt, i) => {
      const subRaw = editMembers(raw, { prompt: JSON.stringify(prompt) });
      return route(c, "completion", path, subRaw, { ...body, prompt } as InferenceRequest, `${requestId}/${i}`, false, onLife).catch((err: unknown) => {
        const error = err instanceof RouterError ? err : new RouterError(502, "The upstream request failed.", "upstream_error", "upstream_unavailable");
        failed ??= error;
        for (const life of lives) abandon(life, failed);
        failNow();
        throw err;
      });
    }),
  );
  const settled = await Promise.race([all, failedEarly]);
  if (failed || !settled) {
    for (const life of lives) abandon(life, failed!);
    throw failed!;
  }
  const routed = settled.flatMap((s) => (s.status === "fulfilled" ? [s.value] : []));
  const headers = answerHeaders(requestId, routed);
  const bodies = routed.map((r) => answerBody("completion", body, r));
  const jsons = bodies.flatMap((b) => ("json" in b ? [b.json] : []));
  if (jsons.length === bodies.length) {
    headers.set("content-type", "application/json");
    return new Response(
      mergeCompletions(
        jsons.map((j) => JSON.parse(j) as CompletionObject),
        n,
      ),
      { status: 200, headers },
    );
  }
  headers.set("content-type", "text/event-stream; charset=utf-8");
  headers.set("cache-control", "no-cache");
  const sources = bodies.flatMap((b) => ("source" in b ? [b.source] : []));
  const feed = batchFeed(sources, n, streamHasUsage("completion", body));
  return new Response(toClient(c, feed, routed[0]!.config.timeouts.decodeIdleMs, requestId), { status: 200, headers });
}

/** POST /v1/route: the decision this body would get, nothing forwarded, no lease taken. */
export async function explainRoute(c: Ctx, raw: string): Promise<Response> {
  // The body is the one the client would send: a completion when it has a prompt and no messages, else chat.
  const value = parseJsonObject(raw);
  const kind: RequestKind = !("messages" in value) && "prompt" in value ? "completion" : "chat";
  const body = checkInferenceRequest(value, kind);
  const { config, view, pool, request, keySource, prefixBlocks } = await buildRouteRequest(c, kind, body, raw.length, true);
  const state = clusterState(c.env, pool);
  // both calls carry the view: they run concurrently, and the snapshot may be the object's first call
  const [routed, snapshot] = await Promise.all([state.route({ ...request, cluster: view }), state.snapshot(view)]);
  if (!routed.ok) throw selectionFailure(routed.error);
  const d: Decision = routed.decision;
  const summary = (role: Role) => ({ id: d[role].id, rule: d[role].rule, failOpen: d[role].failOpen, fallbacks: d[role].fallbacks });
  return c.json({
    protocol: config.protocol,
    policy: config.policy,
    // SPEC 8: how it would be served and why; the prompt's tokens on the chosen D and those D lacks
    mode: d.mode,
    reason: d.reason,
    promptTokens: d.tokens.prompt,
    uncachedTokens: d.tokens.uncachedOnDecode,
    // SPEC 9: predicted disaggregation's TTFT for the option taken (each candidate shows its own)
    ...(d.predictedTtftMs !== undefined ? { predictedTtftMs: d.predictedTtftMs } : {}),
    prefill: summary("prefill"),
    decode: summary("decode"),
    key: { source: keySource, hash: request.key, prefixBlocks },
    rule: { prefill: d.prefill.rule, decode: d.decode.rule },
    candidates: { prefill: d.prefill.candidates, decode: d.decode.candidates },
    // every decode node that could serve it is busy: the request would wait at the edge (SPEC 8)
    admission: routed.wouldWait ? { wait: true, queued: routed.wouldWait.queued } : { wait: false },
    // health, breaker, failures, in-flight load and engine signals of every node, as the Durable Object sees them
    nodes: snapshot.nodes.map(({ id, healthy, probeUp, breaker, ejectedUntil, busyUntil, failureStreak, failuresTotal, inflight, drain, signals, rates }) => ({
      id,
      healthy,
      probeUp,
      breaker,
      ejectedUntil,
      busyUntil,
      failureStreak,
      failuresTotal,
      inflight,
      drain,
      signals,
      // learned rates (SPEC 9), whatever the disaggregation
      rates,
    })),
  });
}
