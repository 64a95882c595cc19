import type { UpstreamFailure } from "./upstream";

// When the router may release a KV handle P holds (vllm's NIXL handle, vllm-mooncake's
// transfer) after a decode attempt that did not produce an answer.
//
// A release is a request D rejects in its serving layer (src/forward/vllm.ts `releaseBody`),
// which makes D tell P that the handle will not be read. If a D already read the handle, or
// already told P itself, P no longer knows the request and logs
//   ERROR "Potentially invalid KV blocks for unrecognized request ... were retrieved by a decode worker"
// (vllm nixl/worker.py `_get_new_notifs`) — the operator's sign of KV corruption. So the router
// releases only when no vLLM server got the handle at all. When one did, vLLM frees P's blocks
// itself on every path:
// - its serving layer refused the request or was cancelled before the engine got it:
//   `_with_kv_transfer_rejection_cleanup` (vllm entrypoints/openai/engine/serving.py, later
//   generate/base/serving.py) notifies P from its `finally` (vLLM >= 0.21, PR #41269);
// - the engine had it but had not scheduled it (our abort when the client left, or a timeout):
//   NixlConnectorScheduler.request_finished sees do_remote_prefill still set and queues an empty
//   read whose notification frees P's blocks (nixl/scheduler.py; the same branch in
//   MooncakeConnectorScheduler.request_finished, mooncake_connector.py);
// - it scheduled it: D reads the blocks (`_read_blocks` in start_load_kv) and notifies P.
// For a stream, D's headers are the line: vLLM's serving layer sends them as soon as it returns
// the StreamingResponse, and only then does iterating it submit the request to the engine
// (AsyncLLM.generate adds the request on its first step). A stream that produced no headers
// within decodeFirstByteMs was never handed to D's engine: D's server is stuck. vLLM >= 0.21
// tells P itself then too: its routes are cancelled when the client (the router) disconnects
// (`with_cancellation`, vllm entrypoints/utils.py, on every OpenAI route) and the cancellation
// runs `_with_kv_transfer_rejection_cleanup`'s `finally`, which notifies P — a router release
// would be the second notification. So after a refusal by D's engine or a stuck stream the router
// releases only when D runs a vLLM older than 0.21 (the node's `vllmVersion`; absent: 0.21 or
// newer), whose serving layer tells nobody. A non-streamed answer has no headers before its end,
// so a timeout there says nothing: left to D. Where no D will ever tell P (D's host lost
// mid-request), P frees the blocks at its own timeout (docs/engines.md).

/** What the router saw of a decode attempt that carried a KV handle and gave no answer. */
export type DecodeContact =
  /** the request ended before D was sent the handle */
  | "unsent"
  /** the connection failed: no server on D's side got the request */
  | "unreachable"
  /** a status from something in front of the engine (a proxy, a tunnel, an Access login, a redirect) */
  | "refused_in_front"
  /** the engine's serving layer refused it (a JSON error): vLLM >= 0.21 has told P itself */
  | "refused_by_engine"
  /** a stream that produced no headers within its timeout: D's server never handed it to its engine (vLLM >= 0.21 tells P when the router hangs up) */
  | "stuck_before_engine"
  /** a non-streamed answer not in time, the request ended while D had it, or D answered 200: the engine may have it */
  | "maybe_admitted";

export function decodeContact(f: UpstreamFailure, stream: boolean): DecodeContact {
  switch (f.kind) {
    case "connect":
      return "unreachable";
    case "status":
      return f.answeredBy === "engine" ? "refused_by_engine" : "refused_in_front";
    case "timeout":
      return stream && !f.headersSeen ? "stuck_before_engine" : "maybe_admitted";
    case "aborted":
    case "broken":
    case "protocol":
      return "maybe_admitted";
  }
}

/**
 * True when no D may have read (or will report on) the handle: only then does the router release
 * it. `decodeNotifiesP`: the D tried tells P itself when its serving layer drops the handle (vLLM >= 0.21).
 */
export function releasesUnreadHandle(contact: DecodeContact, decodeNotifiesP = true): boolean {
  switch (contact) {
    case "unsent":
    case "unreachable":
    case "refused_in_front":
      return true;
    case "refused_by_engine":
    case "stuck_before_engine":
      return !decodeNotifiesP;
    case "maybe_admitted":
      return false;
  }
}

/** vLLM >= 0.21 tells P when its serving layer refuses or drops a request carrying a handle (PR #41269); absent: taken as 0.21 or newer. */
export function notifiesPItself(vllmVersion: string | undefined): boolean {
  if (vllmVersion === undefined) return true;
  const [major = 0, minor = 0] = vllmVersion.split(/[.+-]/).map(Number);
  return major > 0 || minor >= 21;
}
