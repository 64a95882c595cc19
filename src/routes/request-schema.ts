import * as v from "valibot";
import { SERVICE_TIERS } from "../auth/service-tier";
import { check, gtValue, integer, looseObject, minLength, minValue, oneOf, renderPath } from "../config/validation";
import { badRequest } from "../errors";

// Only what the router itself relies on is checked; every other field passes through to the
// nodes untouched (they validate their own parameters).

const STRING = "must be a string";
const int = v.pipe(v.number(), integer());
const tokenLimit = v.optional(v.nullable(v.pipe(v.number(), integer(), minValue(0))));

const contentPart = looseObject({ type: v.string() });
const message = looseObject({
  role: v.string(STRING),
  content: v.optional(v.nullable(v.union([v.string(), v.array(contentPart)]))),
});

const common = {
  model: v.pipe(v.string(STRING), minLength(1, "must not be empty")),
  stream: v.optional(v.boolean("must be a boolean")),
  user: v.optional(v.string(STRING)),
  max_tokens: tokenLimit,
  max_completion_tokens: tokenLimit,
  stream_options: v.optional(v.nullable(looseObject({ include_usage: v.optional(v.boolean()) }))),
  // SPEC 9: the request's band in the edge queue (OpenAI's values; `auto` is `default`)
  service_tier: v.optional(v.nullable(oneOf(SERVICE_TIERS))),
};

export const ChatRequestSchema = looseObject({
  ...common,
  messages: v.pipe(v.array(message, "must be an array"), minLength(1, "must not be empty")),
});

const POSITIVE_INT = "must be a positive integer";
const tokenIds = v.array(int);
// strings, token ids, or token-id lists, none empty: the three forms share the outer check, so
// at most one of them fits a value and names its problem
const promptList = v.pipe(v.union([v.array(v.string()), tokenIds, v.array(v.pipe(tokenIds, minLength(1)))]), minLength(1));

export const CompletionRequestSchema = looseObject({
  ...common,
  prompt: v.union([v.string(), promptList]),
  // a batch's choices are numbered prompt * n + sample: the router must read n as the engine does
  n: v.optional(v.pipe(v.number(POSITIVE_INT), integer(POSITIVE_INT), gtValue(0, POSITIVE_INT))),
});

/** POST /v1/responses: only what routing reads is checked; the engine validates the rest. */
export const ResponsesRequestSchema = looseObject({
  model: common.model,
  stream: common.stream,
  user: common.user,
  service_tier: common.service_tier,
  input: v.union([v.string(), v.array(looseObject({}))]),
  instructions: v.optional(v.nullable(v.string(STRING))),
  max_output_tokens: v.optional(v.nullable(v.pipe(v.number(), integer(), gtValue(0)))),
  previous_response_id: v.optional(v.nullable(v.string(STRING))),
});

export type RequestKind = "chat" | "completion" | "responses";
export type ChatRequest = v.InferOutput<typeof ChatRequestSchema>;
export type CompletionRequest = v.InferOutput<typeof CompletionRequestSchema>;
export type InferenceRequest = (ChatRequest | CompletionRequest) & Record<string, unknown>;

/** A request body that must be one JSON object (every route that takes a body); 400 invalid_json otherwise. */
export function parseJsonObject(raw: string): Record<string, unknown> {
  let value: unknown;
  try {
    value = JSON.parse(raw);
  } catch {
    throw badRequest("We could not parse the JSON body of your request.", null, "invalid_json");
  }
  if (!value || typeof value !== "object" || Array.isArray(value)) throw badRequest("The request body must be a JSON object.", null, "invalid_json");
  return value as Record<string, unknown>;
}

/** Parses the body text as JSON and validates it; a RouterError 400 names the bad field. */
export const parseInferenceRequest = (raw: string, kind: RequestKind) => checkInferenceRequest(parseJsonObject(raw), kind);

/** Validates a body already parsed as one JSON object. */
export function checkInferenceRequest(value: Record<string, unknown>, kind: RequestKind): InferenceRequest {
  const schema = kind === "chat" ? ChatRequestSchema : kind === "completion" ? CompletionRequestSchema : ResponsesRequestSchema;
  const parsed = check(schema, value);
  if (!parsed.ok) {
    const issue = parsed.issues[0]!;
    const param = renderPath(issue.path) || null;
    throw badRequest(
      issue.missing ? `Missing required parameter: '${param}'.` : `Invalid value for '${param}': ${issue.message}.`,
      param,
      issue.missing ? "missing_required_parameter" : "invalid_type",
    );
  }
  // the body as the client sent it: every field, in its order (the schemas only check)
  return value as InferenceRequest;
}
