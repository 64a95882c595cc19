// An engine that fails after it sent a stream's headers says so inside the stream: an SSE event
// whose data is an error object, then `data: [DONE]`.
// - vLLM: `data: {"error": {"message", "type", "param", "code"}}` (chat_completion/serving.py,
//   completion/serving.py: `except GenerationError` — a request whose engine output finished
//   with reason "error", code 500 — and `except Exception` -> `create_streaming_error_response`,
//   whose code follows the exception: 400 for a ValueError, 501 for a NotImplementedError, 500
//   else; vllm entrypoints/openai/engine/serving.py). Older releases wrote
//   `{"error": {"object": "error", "message", ...}}`, same member.
// - SGLang: the same member (entrypoints/openai/serving_base.py `create_streaming_error_response`,
//   code = the HTTP status): serving_chat.py / serving_completions.py write it when the scheduler
//   aborted the request (`finish_reason.type == "abort"` with its status_code: 500 when a decode
//   node's KV transfer failed, disaggregation/decode.py `prepare_abort(...,
//   INTERNAL_SERVER_ERROR)`; 400 for a request it found invalid) and for a ValueError (400). Its
//   native /generate writes `{"error": {"message"}}` without a code, for a ValueError only (the
//   request's validation): the client's.
// - The Responses API's error event: `event: error`, data `{"type": "error", "code", "message"}`.
// The stream reader (sse-reader.ts) finds such an event and cuts the stream at its start; this
// says which data opens one and what it reports.

/** What an engine said when it reported an error inside its stream. */
export interface EngineError {
  /** its message (at most 300 characters) */
  message: string;
  /** the HTTP status it gave the error (its `code`), when it gave one */
  status: number | null;
  /** it was the stream's first event: nothing of the answer had been sent */
  first: boolean;
}

/** Data that opens an error object: `{"error": {...}` or `"..."`, or a Responses error event's `{"type": "error"`. */
export const opensError = (dataHead: string) => /^\s*\{\s*(?:"error"\s*:\s*[{"]|"type"\s*:\s*"error")/.test(dataHead);

/** The message and status of an error event's data (cut or not). */
export function engineErrorOf(data: string): Omit<EngineError, "first"> {
  let message: unknown;
  let code: unknown;
  try {
    const event = JSON.parse(data) as { error?: unknown; type?: unknown; message?: unknown; code?: unknown };
    const error = event.error;
    if (typeof error === "string") message = error;
    else if (error && typeof error === "object") ({ message, code } = error as { message?: unknown; code?: unknown });
    else if (event.type === "error") ({ message, code } = event);
  } catch {
    // cut short: read what can be read
    const m = /"message"\s*:\s*"((?:[^"\\]|\\.)*)"/.exec(data);
    if (m) {
      try {
        message = JSON.parse(`"${m[1]}"`);
      } catch {
        message = m[1];
      }
    }
    code = /"code"\s*:\s*"?(\d{3})\b/.exec(data)?.[1];
  }
  const status = Number(code);
  const text = typeof message === "string" && message ? message : "the engine reported an error";
  return {
    message: text.length > 300 ? `${text.slice(0, 300)}...` : text,
    // a number or a string of three digits, within the HTTP error range
    status: (typeof code === "number" || /^\d{3}$/.test(String(code))) && status >= 400 && status <= 599 ? status : null,
  };
}
