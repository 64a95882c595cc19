import type { Role } from "../routing/types";
import { BUSY_RETRY_DEFAULT_MS, BUSY_RETRY_MAX_MS } from "../state/health-table";
import type { LegOutcome, LegReport } from "../state/types";
import type { TraceContext } from "../observability/trace";
import type { EngineError } from "./engine-error";
import type { NodeAccess } from "../config/node-access";

/** A node as the forwarding code needs it. */
export interface UpstreamNode {
  id: string;
  url: string;
  bootstrapPort: number;
  /** the address decode nodes use for this node's bootstrap server (IPv6 in brackets) */
  bootstrapHost: string;
  /** how requests reach it (binding, bearer token, Access service token): src/config/node-access.ts */
  access: NodeAccess;
}

export type FailureKind = "connect" | "timeout" | "status" | "aborted" | "protocol" | "broken";

/**
 * Node statuses that mean the node validated the client's request and refused it (bad
 * parameters, prompt too long, a model name no node knows): the client's fault, passed on.
 * Every other non-200 status (401/403 from a wrong node token, 3xx, 408, 429,
 * 5xx, 204 to a stream) is the node's fault: it counts against the node and the client gets
 * the router's own message — except a busy node's (BUSY_STATUSES) and an engine's own 501.
 */
const CLIENT_FAULT_STATUSES = new Set([400, 404, 413, 422]);

/**
 * Statuses of a node that is full, not broken, by HTTP's own definition: 503 "temporary overload
 * or scheduled maintenance" (RFC 9110 15.6.4) and 429 "too many requests" (RFC 6585), answered by
 * an engine's admission control or the gateway or rate limiter in front of it, often with a
 * retry-after. The request goes to the next node, and the node is not counted towards ejection:
 * a load spike must not eject every decode node at once. A node that is down is still caught by
 * the probes and by every other failure.
 */
const BUSY_STATUSES = new Set([429, 503]);

/**
 * 501 Not Implemented, when the engine itself answers it (a JSON error), says the engine does not
 * support what this request asks: vLLM maps a NotImplementedError raised while serving a request
 * to 501 "NotImplementedError" (vllm entrypoints/openai/engine/serving.py `create_error_response`:
 * e.g. beam search over an embeddings prompt, an encoder-decoder prompt), and SGLang answers 501
 * when a handler does not support the streaming or non-streaming form asked for
 * (sgl-project/sglang entrypoints/openai/serving_base.py `_handle_streaming_request`: "... does
 * not support streaming requests"). The client's request, not a broken node: passed on, never
 * counted. A 501 from something in front of the engine (a proxy that does not implement our
 * method or encoding: not JSON) would fail every request and stays the node's fault.
 */
const UNSUPPORTED_BY_ENGINE = 501;

/**
 * Who is at fault for a node's non-200 status: the client's request, a node that is full, or the
 * node. A 503 that is not the engine's (not JSON) and names no retry-after is an ingress or load
 * balancer with no ready backend (Kubernetes ingress-nginx, Envoy "no healthy upstream"): the
 * node is down, not full (`hinted` false).
 */
export function statusOutcome(status: number, answeredBy: "engine" | "front" | null, hinted = true): "client_error" | "busy" | "failure" {
  if (CLIENT_FAULT_STATUSES.has(status) || (status === UNSUPPORTED_BY_ENGINE && answeredBy === "engine")) return "client_error";
  if (status === 503 && answeredBy === "front" && !hinted) return "failure";
  if (BUSY_STATUSES.has(status)) return "busy";
  return "failure";
}

/** Who answered a status: the engine's serving layer (its errors are JSON) or something in front of it. */
export const answeredByOf = (headers: Headers): "engine" | "front" => ((headers.get("content-type") ?? "").includes("json") ? "engine" : "front");

/** RFC 9110 10.2.3: delay-seconds, or an HTTP-date (IMF-fixdate, or the obsolete RFC 850 and asctime forms, section 5.6.7). */
const DELAY_SECONDS = /^\d+$/;
const HTTP_DATE =
  /^(?:[A-Z][a-z]{2}, \d{2} [A-Z][a-z]{2} \d{4} \d{2}:\d{2}:\d{2} GMT|[A-Z][a-z]+day, \d{2}-[A-Z][a-z]{2}-\d{2} \d{2}:\d{2}:\d{2} GMT|[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \d{4})$/;

/** A `retry-after` header in ms, within [0, BUSY_RETRY_MAX_MS]; null when absent or not one of RFC 9110's forms (`-5`, `+5`, `1.5` are not). */
export function retryAfterMs(value: string | null, now = Date.now()): number | null {
  const text = value?.trim() ?? "";
  const ms = DELAY_SECONDS.test(text) ? Number(text) * 1000 : HTTP_DATE.test(text) ? Date.parse(text) - now : Number.NaN;
  return Number.isFinite(ms) ? Math.min(BUSY_RETRY_MAX_MS, Math.max(0, ms)) : null;
}

/** Header that marks the router's own upstream requests; a request carrying it is a loop. */
export const HOP_HEADER = "x-pd-edge-router-hop";

/** A leg that did not produce a usable answer. Carries what health accounting and the client need. */
export class UpstreamFailure extends Error {
  constructor(
    readonly leg: Role,
    readonly node: string,
    readonly kind: FailureKind,
    message: string,
    readonly status: number | null = null,
    /** for a client-fault status: the node's own message, safe to show the client */
    readonly clientMessage: string | null = null,
    /** for a status: whether the engine's own serving layer answered it (a JSON body) or something in front of it did */
    readonly answeredBy: "engine" | "front" | null = null,
    /** for a busy status: how long the node asked to be left alone (retry-after, ms) */
    public retryAfterMs: number | null = null,
    /** the node's response headers had arrived before the leg failed */
    readonly headersSeen = false,
    /** a status came with a retry-after (a 503 from in front of the engine without one is a failure: statusOutcome) */
    readonly hinted = true,
  ) {
    super(message);
    this.name = "UpstreamFailure";
  }

  /** the node reported this inside its stream, as its first event (its status line was 200) */
  errorEvent: EngineError | null = null;

  /** A refused request is the client's fault and does not count against the node; an abort tells nothing; a full node is busy. */
  get outcome(): LegOutcome {
    if (this.kind === "aborted") return "aborted";
    if (this.kind === "status" && this.status !== null) return statusOutcome(this.status, this.answeredBy, this.hinted);
    return "failure";
  }

  /** Worth trying on another node: the node failed or is full, not the request. */
  get retryable(): boolean {
    return this.outcome === "failure" || this.outcome === "busy";
  }

  /** busy: with the node's retry-after, which the object honours (state/health.ts onBusy) */
  report(ms?: number): LegReport {
    return { node: this.node, outcome: this.outcome, ms, retryAfterMs: this.retryAfterMs };
  }
}

export interface LegCall {
  leg: Role;
  node: UpstreamNode;
  path: string;
  body: string;
  /** unique to this request (and attempt): engines key KV handles and aborts by it */
  upstreamId: string;
  trace: TraceContext;
  /** the request's signal: the client gone, or the request ended */
  signal: AbortSignal;
  /** time allowed until the response headers */
  timeoutMs: number;
  /** headers this leg adds (vllm-mooncake: P's X-data-parallel-rank) */
  headers?: Record<string, string> | undefined;
}

/** Upstream request headers are built from scratch: nothing of the client's (no Authorization, no hop-by-hop) passes. */
export function upstreamHeaders(node: UpstreamNode, upstreamId: string, trace: TraceContext, extra: Record<string, string> = {}): Headers {
  const headers = new Headers({
    "content-type": "application/json",
    accept: "application/json, text/event-stream",
    "x-request-id": upstreamId,
    traceparent: trace.child(),
    [HOP_HEADER]: "1",
  });
  if (trace.state) headers.set("tracestate", trace.state);
  // the node's own credentials (bearer, Access service token), and nothing else of anyone's
  for (const [name, value] of Object.entries(node.access.headers)) headers.set(name, value);
  for (const [name, value] of Object.entries(extra)) headers.set(name, value);
  return headers;
}

/**
 * One upstream leg: its fetch, its abort controller and its current deadline. The deadline
 * moves with the phase (headers, the first body byte, the whole body, the next byte) and
 * aborting the controller ends whatever read is pending.
 */
export class Leg {
  readonly controller = new AbortController();
  readonly started = Date.now();
  response!: Response;
  /** ms until the response headers arrived */
  ms = 0;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #timedOut: string | null = null;
  /** the body's reader, once a caller streams it (bodyReader) */
  #reader: ReadableStreamDefaultReader<Uint8Array> | null = null;
  /** why the leg was stopped; a read that then ends `done` ended for this reason, not because the node finished */
  stopped: string | null = null;
  readonly #onRequestAbort = () => this.#stop("request ended");

  private constructor(readonly call: LegCall) {
    if (call.signal.aborted) this.controller.abort("request ended");
    else call.signal.addEventListener("abort", this.#onRequestAbort, { once: true });
  }

  /** The response body's reader, for a caller that streams it; stopping the leg cancels it first. */
  bodyReader(): ReadableStreamDefaultReader<Uint8Array> {
    this.#reader ??= (this.response.body as ReadableStream<Uint8Array>).getReader();
    return this.#reader;
  }

  /**
   * Stops the leg. A body read pending under an aborted fetch is rejected with an error that
   * captures its async stack, and workerd keeps it, with every closure on that stack (the whole
   * request: 2-8 KB a client that left mid-stream, issue 25 item 1). So the body is cancelled
   * first (the pending read resolves `done`; callers ask `stopped` why) and the fetch is aborted
   * a microtask later, when no read waits on it.
   */
  #stop(reason: string): void {
    this.stopped ??= reason;
    const reader = this.#reader;
    if (!reader) {
      this.controller.abort(reason);
      return;
    }
    reader.cancel(reason).catch(() => undefined);
    queueMicrotask(() => this.controller.abort(reason));
  }

  get node(): string {
    return this.call.node.id;
  }

  /** The request this leg belongs to has ended (the client left, or it finished). */
  get requestEnded(): boolean {
    return this.call.signal.aborted;
  }

  /** Sends the leg and waits for its headers; resolves only on 200, else throws an UpstreamFailure. */
  static async send(call: LegCall): Promise<Leg> {
    const leg = new Leg(call);
    leg.deadline(call.timeoutMs, `did not answer within ${call.timeoutMs} ms`);
    let response: Response;
    try {
      response = await call.node.access.fetch(new URL(call.path, call.node.url), {
        method: "POST",
        headers: upstreamHeaders(call.node, call.upstreamId, call.trace, call.headers),
        body: call.body,
        signal: leg.controller.signal,
        redirect: "manual",
      });
    } catch (err) {
      leg.close();
      throw leg.failure(err, "connect", "is unreachable");
    }
    leg.response = response;
    leg.ms = Date.now() - leg.started;
    if (response.status !== 200) {
      const status = response.status;
      const text = statusOutcome(status, answeredByOf(response.headers)) === "client_error" ? await leg.text().catch(() => "") : "";
      leg.abort("rejected");
      throw leg.#statusFailure(status, text, response.headers);
    }
    return leg;
  }

  /** Sets the time left for the current phase; past it the leg is aborted and reads fail as a timeout. */
  deadline(ms: number, what: string): void {
    clearTimeout(this.#timer);
    this.#timer = setTimeout(() => {
      this.#timedOut = what;
      this.#stop("upstream timeout");
    }, ms);
  }

  clearDeadline(): void {
    clearTimeout(this.#timer);
  }

  /** Reads the whole body (under the current deadline). */
  async text(): Promise<string> {
    try {
      return await this.response.text();
    } catch (err) {
      throw this.failure(err, "broken", "broke off its answer");
    }
  }

  /** Maps an error of a fetch or a read of this leg to a failure: timeout, the request gone, or the node's. */
  failure(err: unknown, kind: FailureKind, what: string): UpstreamFailure {
    if (err instanceof UpstreamFailure) return err;
    const { leg, node } = this.call;
    if (this.#timedOut) return new UpstreamFailure(leg, node.id, "timeout", `${leg} node ${node.id} ${this.#timedOut}`, null, null, null, null, this.response !== undefined);
    if (this.call.signal.aborted) return new UpstreamFailure(leg, node.id, "aborted", "the request ended");
    return new UpstreamFailure(leg, node.id, kind, `${leg} node ${node.id} ${what}: ${(err as Error)?.message ?? String(err)}`);
  }

  /**
   * The node answered 200 and then an error event as its stream's first event (sse-reader.ts):
   * nothing reached the client, so it is handled as the status the engine gave the error — a
   * refusal passed on, a busy node, or a node failure to fail over from. No status: SGLang's
   * /generate, which writes none only for a ValueError (the request's validation): a 400.
   */
  errorEventFailure(err: EngineError): UpstreamFailure {
    const { leg, node } = this.call;
    const status = err.status ?? 400;
    const outcome = statusOutcome(status, "engine");
    const message = `${leg} node ${node.id} sent an error event${err.status ? ` (HTTP ${err.status})` : ""}: ${redact(err.message, node.access.secrets)}`;
    const clientMessage = outcome === "client_error" ? redact(err.message, node.access.secrets) : null;
    const failure = new UpstreamFailure(leg, node.id, "status", message, status, clientMessage, "engine", outcome === "busy" ? BUSY_RETRY_DEFAULT_MS : null, true);
    failure.errorEvent = err;
    return failure;
  }

  protocolFailure(what: string): UpstreamFailure {
    return new UpstreamFailure(this.call.leg, this.node, "protocol", `${this.call.leg} node ${this.node} ${what}`);
  }

  #statusFailure(status: number, text: string, headers: Headers): UpstreamFailure {
    const { leg, node } = this.call;
    // An engine's own refusal is JSON (vLLM's ErrorResponse, SGLang's ORJSONResponse); a proxy,
    // a tunnel, an Access login or a redirect in front of it answers something else.
    const answeredBy = answeredByOf(headers);
    const hint = retryAfterMs(headers.get("retry-after"));
    const outcome = statusOutcome(status, answeredBy, hint !== null);
    const busy = outcome === "busy";
    const wait = busy ? (hint ?? BUSY_RETRY_DEFAULT_MS) : null;
    // 508 is the router's own loop refusal (HOP_HEADER) when a node URL leads back to it under another name
    const why = status === 508 ? ": its URL leads back to the router (a routing loop)" : busy ? ": it is busy" : "";
    const message = `${leg} node ${node.id} answered HTTP ${status}${why}`;
    const clientMessage = outcome === "client_error" ? clientMessageOf(text, node.access.secrets) : null;
    return new UpstreamFailure(leg, node.id, "status", message, status, clientMessage, answeredBy, wait, false, hint !== null);
  }

  abort(reason = "aborted"): void {
    this.#stop(reason);
    this.close();
  }

  /** Stops the deadline and detaches from the request's signal (the leg's work is done). */
  close(): void {
    clearTimeout(this.#timer);
    this.call.signal.removeEventListener("abort", this.#onRequestAbort);
  }
}

/** The message of a node's error body, short, with the node's own credentials removed should it echo them. */
export function clientMessageOf(text: string, secrets: readonly string[]): string | null {
  let message: unknown;
  try {
    const body = JSON.parse(text) as { error?: { message?: unknown } | string; message?: unknown; detail?: unknown };
    message = typeof body.error === "string" ? body.error : (body.error?.message ?? body.message ?? body.detail);
  } catch {
    return null;
  }
  if (typeof message !== "string" || !message) return null;
  const clean = redact(message, secrets);
  return clean.length > 1000 ? `${clean.slice(0, 1000)}...` : clean;
}

/** A node's message with every credential value its requests carry removed, should it echo one (longest first: a value inside another goes with it). */
export function redact(message: string, secrets: readonly string[]): string {
  let out = message;
  for (const secret of [...secrets].sort((a, b) => b.length - a.length)) if (secret) out = out.split(secret).join("[redacted]");
  return out;
}

/** Parses a leg's JSON body text as an object, or fails as a protocol error. */
export function parseLegJson(leg: Leg, text: string): Record<string, unknown> {
  try {
    const value: unknown = JSON.parse(text);
    if (value && typeof value === "object" && !Array.isArray(value)) return value as Record<string, unknown>;
  } catch {
    // fall through
  }
  throw leg.protocolFailure("answered something that is not a JSON object");
}
