import { chargeRateLimit } from "../auth/client-access";
import { currentConfig, requireConfig } from "../config/runtime";
import { badRequest, RouterError } from "../errors";
import { MAX_BATCH_PROMPTS } from "../forward/batch";
import type { Ctx } from "./app-env";
import { singleResponse } from "./answer";
import { batchPrompts, forwardBatch } from "./batch-completions";
import { parseInferenceRequest, parseJsonObject, type InferenceRequest, type RequestKind } from "./request-schema";
import { route } from "./routed-request";

// The routed handlers. Each drives one request's life cycle: parse the body, route it (admit it at
// the pool's object, pick P and D, take the lease: routed-request.ts), run the protocol's legs
// (P's, then D's, until D's first byte), and answer from D, which ends the request
// (answer.ts). A failure on the way ends it where it happens, once.

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
  return singleResponse(c, kind, body, requestId, await route(c, { kind, path, raw, body, requestId }));
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
  const routed = await route(c, { kind: "completion", path, raw, body, requestId, oneHop: true });
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
  const routed = await route(c, { kind: "completion", path: "/generate", raw, body, requestId });
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
