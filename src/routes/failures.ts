import type { Protocol } from "../config/schema";
import { badRequest, RouterError } from "../errors";
import { UpstreamFailure } from "../forward/upstream";
import type { SelectionError } from "../routing/types";
import { BUSY_RETRY_DEFAULT_MS } from "../state/health-table";
import type { AdmissionError } from "../state/types";
import type { InferenceRequest } from "./request-schema";

// What a routed request that could not be served tells its client: one RouterError each.

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

/** Whatever a request's routing or legs threw, as the client's error. */
export function failureOf(err: unknown): RouterError {
  if (err instanceof RouterError) return err;
  if (err instanceof UpstreamFailure) return upstreamError(err);
  return new RouterError(502, "The upstream request failed.", "upstream_error", "upstream_unavailable");
}
