import type { Role } from "../routing/types";
import type { LegOutcome, LegReport } from "../state/types";

/** A node as the forwarding code needs it. */
export interface UpstreamNode {
  id: string;
  url: string;
  bootstrapPort: number;
  /** bearer token from the secret named by the node's apiKeySecret */
  token: string | null;
}

export type FailureKind = "connect" | "timeout" | "status" | "aborted" | "protocol";

/** A leg that did not produce a usable answer. Carries what health accounting and the client need. */
export class UpstreamFailure extends Error {
  constructor(
    readonly leg: Role,
    readonly node: string,
    readonly kind: FailureKind,
    message: string,
    readonly status: number | null = null,
    /** the node's own error body (4xx), passed on to the client */
    readonly body: string | null = null,
  ) {
    super(message);
    this.name = "UpstreamFailure";
  }

  /** 4xx is the client's fault and does not count against the node; an abort tells nothing. */
  get outcome(): LegOutcome {
    if (this.kind === "aborted") return "aborted";
    if (this.kind === "status" && this.status !== null && this.status < 500) return "client_error";
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
  requestId: string;
  /** the client's signal: its disconnect aborts the leg */
  signal: AbortSignal;
  /** time allowed until the response headers (P answers only after its prefill) */
  timeoutMs: number;
}

export interface LegResponse {
  response: Response;
  /** ms until the response headers arrived */
  ms: number;
  /** aborts the leg (also while its body streams) */
  abort(reason?: string): void;
}

/** Upstream request headers are built from scratch: nothing of the client's (no Authorization, no hop-by-hop) passes. */
export function upstreamHeaders(node: UpstreamNode, requestId: string): Headers {
  const headers = new Headers({ "content-type": "application/json", accept: "application/json, text/event-stream", "x-request-id": requestId });
  if (node.token) headers.set("authorization", `Bearer ${node.token}`);
  return headers;
}

/**
 * Sends one leg and waits for its response headers. Resolves only on 2xx; everything else
 * (refused, reset, timed out, non-2xx, client gone) becomes an UpstreamFailure.
 */
export async function callLeg(call: LegCall): Promise<LegResponse> {
  const controller = new AbortController();
  const started = Date.now();
  let timedOut = false;
  const onClientAbort = () => controller.abort("client disconnected");
  if (call.signal.aborted) onClientAbort();
  else call.signal.addEventListener("abort", onClientAbort, { once: true });
  const timer = setTimeout(() => {
    timedOut = true;
    controller.abort("upstream timeout");
  }, call.timeoutMs);
  const fail = (kind: FailureKind, message: string, status: number | null = null, body: string | null = null) =>
    new UpstreamFailure(call.leg, call.node.id, kind, message, status, body);
  try {
    let response: Response;
    try {
      response = await fetch(new URL(call.path, call.node.url), {
        method: "POST",
        headers: upstreamHeaders(call.node, call.requestId),
        body: call.body,
        signal: controller.signal,
      });
    } catch (err) {
      if (timedOut) throw fail("timeout", `${call.leg} node ${call.node.id} did not answer within ${call.timeoutMs} ms`);
      if (call.signal.aborted) throw fail("aborted", "client disconnected");
      throw fail("connect", `${call.leg} node ${call.node.id} is unreachable: ${(err as Error).message}`);
    }
    if (!response.ok) {
      const text = await response.text().catch(() => "");
      throw fail("status", `${call.leg} node ${call.node.id} answered ${response.status}`, response.status, text.slice(0, 4096));
    }
    return { response, ms: Date.now() - started, abort: (reason) => controller.abort(reason) };
  } catch (err) {
    call.signal.removeEventListener("abort", onClientAbort);
    throw err;
  } finally {
    clearTimeout(timer);
  }
}

/** Reads a (non-streamed) JSON body of a leg, failing as a protocol error when it is not JSON. */
export async function readLegJson(leg: Role, node: string, res: Response): Promise<Record<string, unknown>> {
  const text = await res.text();
  try {
    const value: unknown = JSON.parse(text);
    if (value && typeof value === "object" && !Array.isArray(value)) return value as Record<string, unknown>;
  } catch {
    // fall through
  }
  throw new UpstreamFailure(leg, node, "protocol", `${leg} node ${node} answered something that is not a JSON object`);
}
