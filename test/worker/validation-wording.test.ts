import { describe, expect, it } from "vitest";
import { parseClusterDocument, type Problem } from "../../src/config/schema";
import { parseInferenceRequest, type RequestKind } from "../../src/routes/request-schema";
import { RouterError } from "../../src/errors";
import { withoutFileEngines } from "./helpers";

withoutFileEngines();

// The schemas moved from zod 3 to valibot (a third of the Worker's size). Operators, scripts and
// clients read these problems: each case below was recorded from the zod 3 schemas before the
// move, so the wording, the paths and their order are the ones the router has always given.

const DOCUMENTS: [string, unknown, Problem[]][] = [
  ["not an object", ["x"], [{ path: "(document)", message: "Expected object, received array" }]],
  ["no nodes", {}, [{ path: "nodes", message: "Required" }]],
  ["an empty node list", { nodes: [] }, [{ path: "nodes", message: "must list at least one node" }]],
  [
    "a node missing its fields",
    { nodes: [{}] },
    [
      { path: "nodes[0].id", message: "Required" },
      { path: "nodes[0].url", message: "Required" },
      { path: "nodes[0].role", message: "Required" },
    ],
  ],
  [
    "wrong types",
    { protocol: 3, policy: [], timeouts: null, health: "x", nodes: [{ id: "p0", url: "http://10.0.0.1:8100", role: "both", weight: "1", drain: 1, models: {}, group: 5 }] },
    [
      { path: "protocol", message: "Expected 'vllm' | 'vllm-mooncake' | 'sglang' | 'colocated', received number" },
      { path: "policy", message: "Expected object, received array" },
      { path: "timeouts", message: "Expected object, received null" },
      { path: "health", message: "Expected object, received string" },
      { path: "nodes[0].group", message: "Expected string, received number" },
      { path: "nodes[0].weight", message: "Expected number, received string" },
      { path: "nodes[0].models", message: "Expected array, received object" },
      { path: "nodes[0].drain", message: "Expected boolean, received number" },
    ],
  ],
  [
    "enum values",
    { protocol: "trt", policy: { prefill: "random", pdGroup: true }, nodes: [{ id: "p0", url: "http://10.0.0.1:8100", role: "encode" }] },
    [
      { path: "protocol", message: "Invalid enum value. Expected 'vllm' | 'vllm-mooncake' | 'sglang' | 'colocated', received 'trt'" },
      { path: "policy.prefill", message: "Invalid enum value. Expected 'round_robin' | 'affinity' | 'cache_aware' | 'least_load', received 'random'" },
      { path: "policy.pdGroup", message: "Expected 'off' | 'prefer' | 'strict', received boolean" },
      { path: "nodes[0].role", message: "Invalid enum value. Expected 'prefill' | 'decode' | 'both', received 'encode'" },
    ],
  ],
  [
    "number bounds",
    { policy: { pdGroupBonus: 11, loadFactor: 0.5, loadSlack: 1.5 }, nodes: [{ id: "p0", url: "http://10.0.0.1:8100", role: "both", weight: 0, bootstrapPort: 70000 }] },
    [
      { path: "policy.pdGroupBonus", message: "Number must be less than or equal to 10" },
      { path: "policy.loadFactor", message: "Number must be greater than or equal to 1" },
      { path: "policy.loadSlack", message: "Expected integer, received float" },
      { path: "nodes[0].weight", message: "Number must be greater than 0" },
      { path: "nodes[0].bootstrapPort", message: "Number must be less than or equal to 65535" },
    ],
  ],
  [
    "all of an integer's problems, in order",
    { timeouts: { prefillMs: -0.5, nonStreamMs: 1000000000000 }, health: { intervalMs: 999.5, downAfter: 0 }, nodes: [{ id: "p0", url: "http://10.0.0.1:8100", role: "both" }] },
    [
      { path: "timeouts.prefillMs", message: "Expected integer, received float" },
      { path: "timeouts.prefillMs", message: "Number must be greater than 0" },
      { path: "timeouts.prefillMs", message: "must be at least 50 (ms)" },
      { path: "timeouts.nonStreamMs", message: "must be at most 21600000 (6 hours)" },
      { path: "health.intervalMs", message: "Expected integer, received float" },
      { path: "health.intervalMs", message: "must be at least 1000 (ms)" },
      { path: "health.downAfter", message: "Number must be greater than 0" },
    ],
  ],
  [
    "string lengths",
    { nodes: [{ id: "p0", url: "http://10.0.0.1:8100", role: "both", group: "", models: [""], bootstrapHost: "h".repeat(254) }] },
    [
      { path: "nodes[0].group", message: "String must contain at least 1 character(s)" },
      { path: "nodes[0].models[0]", message: "String must contain at least 1 character(s)" },
      { path: "nodes[0].bootstrapHost", message: "String must contain at most 253 character(s)" },
    ],
  ],
  [
    "unknown keys, named together at their object",
    { extra: 1, policy: { cacheAware: { blockchars: 1, other: 2 } }, nodes: [{ id: "p0", url: "http://10.0.0.1:8100", role: "both", Role: "x" }] },
    [
      { path: "policy.cacheAware", message: "Unrecognized key(s) in object: 'blockchars', 'other'" },
      { path: "nodes[0]", message: "Unrecognized key(s) in object: 'Role'" },
      { path: "(document)", message: "Unrecognized key(s) in object: 'extra'" },
    ],
  ],
  [
    "custom messages",
    {
      health: { probePath: "health", intervalMs: 10 },
      signals: { kvBusy: 0, intervalMs: 10, queueBusy: 0 },
      admission: { queueMs: -1 },
      reach: { binding: "NODES", access: { clientId: "ADMIN_TOKEN" } },
      nodes: [{ id: "a b", url: "ftp://u:p@h/x", role: "both", apiKeySecret: "API_KEYS", bootstrapHost: "h:80" }],
    },
    [
      { path: "health.intervalMs", message: "must be at least 1000 (ms)" },
      { path: "health.probePath", message: "must be a path starting with / (no query)" },
      { path: "reach.binding", message: "must name a VPC_* Workers VPC binding" },
      {
        path: "reach.access.clientId",
        message: "must name a NODE_* Worker secret (holding the service token's client ID), never one of the router's own secrets",
      },
      { path: "reach.access.clientSecret", message: "Required" },
      { path: "signals.intervalMs", message: "must be at least 1000 (ms)" },
      { path: "signals.kvBusy", message: "must be above 0" },
      { path: "signals.queueBusy", message: "Number must be greater than 0" },
      { path: "admission.queueMs", message: "must be 0 (no waiting) or more" },
      { path: "nodes[0].id", message: "must match [A-Za-z0-9._-]{1,64}" },
      { path: "nodes[0].url", message: "scheme must be http or https; must not carry credentials; must be an origin without path, query or fragment" },
      { path: "nodes[0].bootstrapHost", message: "must be a host name or an IP address, without scheme or port" },
      {
        path: "nodes[0].apiKeySecret",
        message: "must name a NODE_* Worker secret (holding the node's bearer token), never one of the router's own secrets",
      },
    ],
  ],
  ["a URL that does not parse", { nodes: [{ id: "p0", url: "10.0.0.1:8100", role: "both" }] }, [{ path: "nodes[0].url", message: "must be an absolute http or https URL" }]],
  ["non-finite weight", { nodes: [{ id: "p0", url: "http://10.0.0.1:8100", role: "both", weight: Infinity }] }, [{ path: "nodes[0].weight", message: "Number must be finite" }]],
];

const REQUESTS: [string, RequestKind, unknown, { message: string; param: string | null; code: string }][] = [
  [
    "missing model",
    "chat",
    { messages: [{ role: "user", content: "x" }] },
    { message: "Missing required parameter: 'model'.", param: "model", code: "missing_required_parameter" },
  ],
  [
    "empty model",
    "chat",
    { model: "", messages: [{ role: "user", content: "x" }] },
    { message: "Invalid value for 'model': must not be empty.", param: "model", code: "invalid_type" },
  ],
  ["model not a string", "chat", { model: 1, messages: [] }, { message: "Invalid value for 'model': must be a string.", param: "model", code: "invalid_type" }],
  ["messages not an array", "chat", { model: "m", messages: {} }, { message: "Invalid value for 'messages': must be an array.", param: "messages", code: "invalid_type" }],
  ["empty messages", "chat", { model: "m", messages: [] }, { message: "Invalid value for 'messages': must not be empty.", param: "messages", code: "invalid_type" }],
  [
    "a message without a role",
    "chat",
    { model: "m", messages: [{ content: "x" }] },
    { message: "Missing required parameter: 'messages[0].role'.", param: "messages[0].role", code: "missing_required_parameter" },
  ],
  [
    "a role not a string",
    "chat",
    { model: "m", messages: [{ role: 1 }] },
    { message: "Invalid value for 'messages[0].role': must be a string.", param: "messages[0].role", code: "invalid_type" },
  ],
  [
    "content of no accepted shape",
    "chat",
    { model: "m", messages: [{ role: "user", content: [1] }] },
    { message: "Invalid value for 'messages[0].content': Invalid input.", param: "messages[0].content", code: "invalid_type" },
  ],
  [
    "a message not an object",
    "chat",
    { model: "m", messages: ["hi"] },
    { message: "Invalid value for 'messages[0]': Expected object, received string.", param: "messages[0]", code: "invalid_type" },
  ],
  [
    "stream not a boolean",
    "chat",
    { model: "m", stream: "yes", messages: [{ role: "user" }] },
    { message: "Invalid value for 'stream': must be a boolean.", param: "stream", code: "invalid_type" },
  ],
  [
    "max_tokens a float",
    "chat",
    { model: "m", max_tokens: 1.5, messages: [{ role: "user" }] },
    { message: "Invalid value for 'max_tokens': Expected integer, received float.", param: "max_tokens", code: "invalid_type" },
  ],
  [
    "max_tokens negative",
    "chat",
    { model: "m", max_completion_tokens: -1, messages: [{ role: "user" }] },
    { message: "Invalid value for 'max_completion_tokens': Number must be greater than or equal to 0.", param: "max_completion_tokens", code: "invalid_type" },
  ],
  [
    "stream_options an array",
    "chat",
    { model: "m", stream_options: [], messages: [{ role: "user" }] },
    { message: "Invalid value for 'stream_options': Expected object, received array.", param: "stream_options", code: "invalid_type" },
  ],
  [
    "include_usage not a boolean",
    "chat",
    { model: "m", stream_options: { include_usage: 1 }, messages: [{ role: "user" }] },
    { message: "Invalid value for 'stream_options.include_usage': Expected boolean, received number.", param: "stream_options.include_usage", code: "invalid_type" },
  ],
  ["missing prompt", "completion", { model: "m" }, { message: "Missing required parameter: 'prompt'.", param: "prompt", code: "missing_required_parameter" }],
  ["prompt of no accepted shape", "completion", { model: "m", prompt: [1, "a"] }, { message: "Invalid value for 'prompt': Invalid input.", param: "prompt", code: "invalid_type" }],
  [
    "empty prompt list",
    "completion",
    { model: "m", prompt: [] },
    { message: "Invalid value for 'prompt': Array must contain at least 1 element(s).", param: "prompt", code: "invalid_type" },
  ],
  [
    "empty token list in a batch",
    "completion",
    { model: "m", prompt: [[1], []] },
    { message: "Invalid value for 'prompt[1]': Array must contain at least 1 element(s).", param: "prompt[1]", code: "invalid_type" },
  ],
  [
    "a float token id",
    "completion",
    { model: "m", prompt: [1, 2.5] },
    { message: "Invalid value for 'prompt[1]': Expected integer, received float.", param: "prompt[1]", code: "invalid_type" },
  ],
  ["n zero", "completion", { model: "m", prompt: "p", n: 0 }, { message: "Invalid value for 'n': must be a positive integer.", param: "n", code: "invalid_type" }],
  ["n a string", "completion", { model: "m", prompt: "p", n: "2" }, { message: "Invalid value for 'n': must be a positive integer.", param: "n", code: "invalid_type" }],
  ["responses input missing", "responses", { model: "m" }, { message: "Missing required parameter: 'input'.", param: "input", code: "missing_required_parameter" }],
  ["responses input a number", "responses", { model: "m", input: 1 }, { message: "Invalid value for 'input': Invalid input.", param: "input", code: "invalid_type" }],
  [
    "responses max_output_tokens zero",
    "responses",
    { model: "m", input: "x", max_output_tokens: 0 },
    { message: "Invalid value for 'max_output_tokens': Number must be greater than 0.", param: "max_output_tokens", code: "invalid_type" },
  ],
  [
    "responses instructions not a string",
    "responses",
    { model: "m", input: "x", instructions: 1 },
    { message: "Invalid value for 'instructions': must be a string.", param: "instructions", code: "invalid_type" },
  ],
];

describe("cluster document problems keep their paths, wording and order", () => {
  it.each(DOCUMENTS)("%s", (_name, doc, problems) => {
    const result = parseClusterDocument(doc);
    expect(result.ok ? [] : result.problems).toEqual(problems);
  });

  it("a document the schemas accept still parses, with its defaults", () => {
    const result = parseClusterDocument({ nodes: [{ id: "p0", url: "http://10.0.0.1:8100", role: "both", bootstrapHost: "fe80::1" }] });
    expect(result.ok && result.config.nodes[0]).toMatchObject({ weight: 1, bootstrapPort: 8998, bootstrapHost: "[fe80::1]", drain: false, reach: {} });
    expect(result.ok && result.config.policy.cacheAware).toMatchObject({ blockChars: 2048, loadFactor: 3 });
  });
});

describe("request body problems keep their OpenAI error text", () => {
  it.each(REQUESTS)("%s", (_name, kind, body, expected) => {
    let error: unknown;
    try {
      parseInferenceRequest(JSON.stringify(body), kind);
    } catch (err) {
      error = err;
    }
    expect(error).toBeInstanceOf(RouterError);
    const { message, param, code } = error as RouterError;
    expect({ message, param, code }).toEqual(expected);
  });

  it("a valid body comes back as sent: every field, in its order", () => {
    const raw = '{"zeta":1,"constructor":{"a":1},"model":"m","prompt":[[1,2],[3]],"n":2}';
    const body = parseInferenceRequest(raw, "completion");
    expect(JSON.stringify(body)).toBe(raw);
  });
});
