import { z } from "zod";
import { badRequest } from "../errors";

// Only what the router itself relies on is checked; every other field passes through to the
// nodes untouched (they validate their own parameters).

const contentPart = z.object({ type: z.string() }).passthrough();
const message = z
  .object({
    role: z.string({ required_error: "is required", invalid_type_error: "must be a string" }),
    content: z.union([z.string(), z.array(contentPart), z.null()]).optional(),
  })
  .passthrough();

const common = {
  model: z.string({ required_error: "is required", invalid_type_error: "must be a string" }).min(1, "must not be empty"),
  stream: z.boolean({ invalid_type_error: "must be a boolean" }).optional(),
  user: z.string({ invalid_type_error: "must be a string" }).optional(),
  max_tokens: z.number().int().nonnegative().nullable().optional(),
  max_completion_tokens: z.number().int().nonnegative().nullable().optional(),
  stream_options: z.object({ include_usage: z.boolean().optional() }).passthrough().nullable().optional(),
};

export const ChatRequestSchema = z
  .object({
    ...common,
    messages: z.array(message, { required_error: "is required", invalid_type_error: "must be an array" }).min(1, "must not be empty"),
  })
  .passthrough();

export const CompletionRequestSchema = z
  .object({
    ...common,
    prompt: z.union([z.string(), z.array(z.string()).min(1), z.array(z.number().int()).min(1), z.array(z.array(z.number().int()).min(1)).min(1)], {
      required_error: "is required",
      invalid_type_error: "must be a string, an array of strings, or token ids",
    }),
    // a batch's choices are numbered prompt * n + sample: the router must read n as the engine does
    n: z.number({ invalid_type_error: "must be a positive integer" }).int("must be a positive integer").positive("must be a positive integer").optional(),
  })
  .passthrough();

/** POST /v1/responses: only what routing reads is checked; the engine validates the rest. */
export const ResponsesRequestSchema = z
  .object({
    model: common.model,
    stream: common.stream,
    user: common.user,
    input: z.union([z.string(), z.array(z.object({}).passthrough())], {
      required_error: "is required",
      invalid_type_error: "must be a string or an array of input items",
    }),
    instructions: z.string({ invalid_type_error: "must be a string" }).nullable().optional(),
    max_output_tokens: z.number().int().positive().nullable().optional(),
    previous_response_id: z.string({ invalid_type_error: "must be a string" }).nullable().optional(),
  })
  .passthrough();

export type RequestKind = "chat" | "completion" | "responses";
export type ChatRequest = z.infer<typeof ChatRequestSchema>;
export type CompletionRequest = z.infer<typeof CompletionRequestSchema>;
export type InferenceRequest = (ChatRequest | CompletionRequest) & Record<string, unknown>;

function fieldPath(path: (string | number)[]): string {
  return path.reduce<string>((out, p) => (typeof p === "number" ? `${out}[${p}]` : out ? `${out}.${p}` : p), "");
}

/** Parses the body text as JSON and validates it; a RouterError 400 names the bad field. */
export function parseInferenceRequest(raw: string, kind: RequestKind): InferenceRequest {
  let value: unknown;
  try {
    value = JSON.parse(raw);
  } catch {
    throw badRequest("We could not parse the JSON body of your request.", null, "invalid_json");
  }
  if (!value || typeof value !== "object" || Array.isArray(value)) {
    throw badRequest("The request body must be a JSON object.", null, "invalid_json");
  }
  const schema = kind === "chat" ? ChatRequestSchema : kind === "completion" ? CompletionRequestSchema : ResponsesRequestSchema;
  const parsed = schema.safeParse(value);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    const param = fieldPath(issue.path) || null;
    const missing =
      (issue.code === "invalid_type" && issue.received === "undefined") || (issue.path.length === 1 && (value as Record<string, unknown>)[String(issue.path[0])] === undefined);
    throw badRequest(
      missing ? `Missing required parameter: '${param}'.` : `Invalid value for '${param}': ${issue.message}.`,
      param,
      missing ? "missing_required_parameter" : "invalid_type",
    );
  }
  return parsed.data as InferenceRequest;
}
