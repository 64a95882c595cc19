import type { Role } from "../routing/types";
import type { LegOutcome, LegReport } from "../state/types";
import type { TraceContext } from "../observability/trace";

/** A node as the forwarding code needs it. */
export interface UpstreamNode {
  id: string;
  url: string;
  bootstrapPort: number;
  /** bearer token from the secret named by the node's apiKeySecret */
  token: string | null;
}

export type FailureKind = "connect" | "timeout" | "status" | "aborted" | "protocol" | "broken";

/**
 * Node statuses that mean the node validated the client's request and refused it (bad
 * parameters, prompt too long, a model name no node knows): the client's fault, passed on.
 * Every other non-200 status (401/403 from a wrong node token, 3xx, 408, 429,
 * 5xx, 204 to a stream) is the node's fault: it counts against the node and the client gets
 * the router's own message.
 */
const CLIENT_FAULT_STATUSES = new Set([400, 404, 413, 422]);

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
  ) {
    super(message);
    this.name = "UpstreamFailure";
  }

  /** A refused request is the client's fault and does not count against the node; an abort tells nothing. */
  get outcome(): LegOutcome {
    if (this.kind === "aborted") return "aborted";
    if (this.kind === "status" && this.status !== null && CLIENT_FAULT_STATUSES.has(this.status)) return "client_error";
    return "failure";
  }

  /** Worth trying on another node: the node failed, not the request. */
  get retryable(): boolean {
    return this.outcome === "failure";
  }

  report(ms?: number): LegReport {
    return ms === undefined ? { node: this.node, outcome: this.outcome } : { node: this.node, outcome: this.outcome, ms };
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
}

/** Upstream request headers are built from scratch: nothing of the client's (no Authorization, no hop-by-hop) passes. */
export function upstreamHeaders(node: UpstreamNode, upstreamId: string, trace: TraceContext): Headers {
  const headers = new Headers({
    "content-type": "application/json",
    accept: "application/json, text/event-stream",
    "x-request-id": upstreamId,
    traceparent: trace.child(),
    [HOP_HEADER]: "1",
  });
  if (trace.state) headers.set("tracestate", trace.state);
  if (node.token) headers.set("authorization", `Bearer ${node.token}`);
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
  private timer: ReturnType<typeof setTimeout> | undefined;
  private timedOut: string | null = null;
  private readonly onRequestAbort = () => this.controller.abort("request ended");

  private constructor(readonly call: LegCall) {
    if (call.signal.aborted) this.controller.abort("request ended");
    else call.signal.addEventListener("abort", this.onRequestAbort, { once: true });
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
      response = await fetch(new URL(call.path, call.node.url), {
        method: "POST",
        headers: upstreamHeaders(call.node, call.upstreamId, call.trace),
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
      const text = CLIENT_FAULT_STATUSES.has(status) ? await leg.text().catch(() => "") : "";
      leg.abort("rejected");
      throw leg.statusFailure(status, text);
    }
    return leg;
  }

  /** Sets the time left for the current phase; past it the leg is aborted and reads fail as a timeout. */
  deadline(ms: number, what: string): void {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      this.timedOut = what;
      this.controller.abort("upstream timeout");
    }, ms);
  }

  clearDeadline(): void {
    clearTimeout(this.timer);
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
    if (this.timedOut) return new UpstreamFailure(leg, node.id, "timeout", `${leg} node ${node.id} ${this.timedOut}`);
    if (this.call.signal.aborted) return new UpstreamFailure(leg, node.id, "aborted", "the request ended");
    return new UpstreamFailure(leg, node.id, kind, `${leg} node ${node.id} ${what}: ${(err as Error)?.message ?? String(err)}`);
  }

  protocolFailure(what: string): UpstreamFailure {
    return new UpstreamFailure(this.call.leg, this.node, "protocol", `${this.call.leg} node ${this.node} ${what}`);
  }

  private statusFailure(status: number, text: string): UpstreamFailure {
    const { leg, node } = this.call;
    // 508 is the router's own loop refusal (HOP_HEADER) when a node URL leads back to it under another name
    const message = `${leg} node ${node.id} answered HTTP ${status}${status === 508 ? ": its URL leads back to the router (a routing loop)" : ""}`;
    if (!CLIENT_FAULT_STATUSES.has(status)) return new UpstreamFailure(leg, node.id, "status", message, status);
    return new UpstreamFailure(leg, node.id, "status", message, status, clientMessageOf(text, node.token));
  }

  abort(reason = "aborted"): void {
    this.controller.abort(reason);
    this.close();
  }

  /** Stops the deadline and detaches from the request's signal (the leg's work is done). */
  close(): void {
    clearTimeout(this.timer);
    this.call.signal.removeEventListener("abort", this.onRequestAbort);
  }
}

/** The message of a node's error body, short, with the node's own token removed should it echo it. */
export function clientMessageOf(text: string, token: string | null): string | null {
  let message: unknown;
  try {
    const body = JSON.parse(text) as { error?: { message?: unknown } | string; message?: unknown; detail?: unknown };
    message = typeof body.error === "string" ? body.error : (body.error?.message ?? body.message ?? body.detail);
  } catch {
    return null;
  }
  if (typeof message !== "string" || !message) return null;
  const clean = token ? message.split(token).join("[redacted]") : message;
  return clean.length > 1000 ? `${clean.slice(0, 1000)}...` : clean;
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
