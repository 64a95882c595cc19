import { usageDetailsOf } from "../observability/usage-details";
import { withFields } from "./body";
import { forwardColocated } from "./colocated";
import { decodeContact, releasesUnreadHandle } from "./handle-release";
import { memberText } from "./json-text";
import { decodeAttempt, failOver, asFailure, sendLeg, withFailover, type DecodeAnswer, type ForwardContext } from "./pipeline";
import { prefillUsageOf, type PrefillUsage } from "./stream";
import { Leg, parseLegJson, type UpstreamNode } from "./upstream";

// vLLM disaggregated serving with a KV connector that hands P's blocks to D through
// kv_transfer_params (NixlConnector; also LMCache's and P2pNccl's NIXL-style params): P
// prefills with max_tokens 1 and answers with a handle, then D decodes with it. Upstream:
// vllm-project/vllm tests/v1/kv_connector/nixl_integration/toy_proxy_server.py (the reference
// proxy) and vllm/distributed/kv_transfer/kv_connector/v1/nixl/scheduler.py (the handle).

const PREFILL_KV_PARAMS = JSON.stringify({
  do_remote_decode: true,
  do_remote_prefill: false,
  remote_engine_id: null,
  remote_block_ids: null,
  remote_host: null,
  remote_port: null,
});

const DROPPED_ON_PREFILL = ["stream_options", "min_tokens", "min_completion_tokens"];

/** P's body: the client's bytes with the prefill-only members set (nothing re-serialised). */
export function vllmPrefillBody(raw: string, parsed: Record<string, unknown>, kvParams = PREFILL_KV_PARAMS): string {
  // the Responses API (vLLM accepts kv_transfer_params there too) names its limit max_output_tokens;
  // `store: false` on P: with VLLM_ENABLE_RESPONSES_API_STORE on, vLLM keeps every stored
  // response in a dict it never evicts (vllm entrypoints/openai/serving_responses.py
  // `response_store`: "we never remove responses from the store"), and P's one-token answer is
  // never asked for again — the conversation continues on D, which stored the real one
  if ("input" in parsed && !("messages" in parsed) && !("prompt" in parsed)) {
    return withFields(raw, { stream: "false", max_output_tokens: "1", store: "false", kv_transfer_params: kvParams }, DROPPED_ON_PREFILL);
  }
  const set: Record<string, string> = { stream: "false", max_tokens: "1" };
  if ("max_completion_tokens" in parsed) set.max_completion_tokens = "1";
  // one handle serves one sequence: P never samples several
  set.n = "1";
  set.kv_transfer_params = kvParams;
  return withFields(raw, set, DROPPED_ON_PREFILL);
}

/** D's body: the client's bytes plus P's handle exactly as P wrote it (absent when P stopped on EOS: D prefills itself). */
export function vllmDecodeBody(raw: string, kvText: string | undefined): string {
  return kvText === undefined || kvText === "null" ? withFields(raw, {}) : withFields(raw, { kv_transfer_params: kvText });
}

/** Model name no node serves: D rejects the release request inside its handler, which is what frees P's blocks. */
export const RELEASE_MODEL = "pd-edge-router-release";

/**
 * Frees the blocks P holds for a handle no D will read. vLLM >= 0.21 D nodes notify P when they
 * reject a request that carries a handle (serving.py `_with_kv_transfer_rejection_cleanup` ->
 * `notify_kv_transfer_request_rejected` -> NixlConnectorScheduler.request_finished, which sends
 * the "done" notification with no blocks read): a request for a model D does not serve is
 * rejected with 404 before it reaches the GPU. Cost: one small HTTP round trip to a D.
 * Without it P holds the blocks until VLLM_NIXL_ABORT_REQUEST_TIMEOUT (480 s) or its lease.
 */
export function releaseBody(kvText: string): string {
  return `{"model":${JSON.stringify(RELEASE_MODEL)},"prompt":"x","max_tokens":1,"stream":false,"kv_transfer_params":${kvText}}`;
}

export async function releaseHandle(ctx: ForwardContext, node: UpstreamNode, kvText: string): Promise<void> {
  const leg = await Leg.send({
    leg: "decode",
    node,
    path: "/v1/completions",
    body: releaseBody(kvText),
    upstreamId: ctx.life.upstreamId(),
    trace: ctx.life.trace,
    signal: new AbortController().signal,
    timeoutMs: 10_000,
  }).catch(() => null);
  // a 404 is the expected answer (Leg.send throws for it); a 200 would mean D served the model
  leg?.abort("release sent");
}

interface Prefilled {
  node: UpstreamNode;
  ms: number;
  usage: PrefillUsage;
  /** P's kv_transfer_params as P wrote them, or undefined when P sent none */
  kvText: string | undefined;
  /** frees P's blocks of this handle (through the D chosen at the time), at most once whoever asks */
  release: () => Promise<void>;
}

/** P's handle in its answer text, or undefined when it has none (P stopped on EOS). */
const handleOf = (text: string): string | undefined => {
  const kv = memberText(text, "kv_transfer_params");
  return kv === undefined || kv === "null" ? undefined : kv;
};

async function prefill(ctx: ForwardContext, body: string, upstreamId: string): Promise<Prefilled> {
  const p = await withFailover(ctx, "prefill", async (node) => {
    const leg = await sendPrefillLeg(ctx, node, body, upstreamId);
    // vLLM answers a non-streamed request only once its prefill is done, so P's headers mean a
    // handle exists: P's body is read to its end even if the request ends meanwhile (the client
    // gone, a batch abandoned) — within prefillMs, the leg's deadline — and its handle released
    // then, off the request's end. Cut off, the read would lose the handle and P would hold the
    // blocks until its timeout (480 s).
    const answer = leg.text().finally(() => leg.close());
    let released: Promise<void> | null = null;
    const release = () =>
      (released ??= answer.then(
        (text) => {
          const kv = handleOf(text);
          return kv ? releaseHandle(ctx, ctx.resolve(ctx.life.chosen.decode), kv) : undefined;
        },
        () => undefined,
      ));
    const unhold = ctx.life.holdHandle(release);
    let text: string;
    try {
      text = await answer;
    } finally {
      unhold();
    }
    const json = parseLegJson(leg, text);
    ctx.life.noteUsageDetails(node.id, usageDetailsOf(json));
    return { node, ms: Date.now() - leg.started, usage: prefillUsageOf(json), kvText: memberText(text, "kv_transfer_params"), release };
  });
  ctx.life.prefillDone({ node: p.node.id, outcome: "ok", ms: p.ms });
  return p;
}

/**
 * P's leg until its headers: the request's end aborts it (vLLM then aborts the request, which
 * frees its blocks: no handle is made); once the headers are in, only the leg's own deadline
 * (prefillMs) ends it.
 */
async function sendPrefillLeg(ctx: ForwardContext, node: UpstreamNode, body: string, upstreamId: string): Promise<Leg> {
  const untilHeaders = new AbortController();
  const requestEnded = () => untilHeaders.abort("request ended");
  const request = ctx.life.signal;
  if (request.aborted) requestEnded();
  else request.addEventListener("abort", requestEnded, { once: true });
  try {
    return await sendLeg(ctx, "prefill", node, body, upstreamId, ctx.timeouts.prefillMs, untilHeaders.signal);
  } finally {
    request.removeEventListener("abort", requestEnded);
  }
}

/**
 * A Responses API turn that continues a stored response (`previous_response_id`): the store and
 * the conversation's history live on the D that answered it (vLLM's response store is the
 * engine's own), so P could neither find the id (404) nor prefill the history. D gets the turn
 * alone and prefills it itself, mostly from its own prefix cache.
 */
export function continuesStoredResponse(parsed: Record<string, unknown>): boolean {
  return "input" in parsed && typeof parsed.previous_response_id === "string" && parsed.previous_response_id !== "";
}

export function decodeAlone(ctx: ForwardContext): Promise<DecodeAnswer> {
  // P's part of the lease ends unused; D answers as a colocated node would
  ctx.life.prefillDone({ node: ctx.life.chosen.prefill, outcome: "aborted" });
  return forwardColocated(ctx);
}

export async function forwardVllm(ctx: ForwardContext): Promise<DecodeAnswer> {
  if (continuesStoredResponse(ctx.parsed)) return decodeAlone(ctx);
  for (let attempt = 0; ; attempt++) {
    // One id per P/D pair: a retry is a new pair with a fresh handle.
    const upstreamId = ctx.life.upstreamId();
    const p = await prefill(ctx, vllmPrefillBody(ctx.raw, ctx.parsed), upstreamId);
    const kv = p.kvText !== undefined && p.kvText !== "null" ? p.kvText : undefined;
    const d = ctx.resolve(ctx.life.chosen.decode);
    // Until D is sent the handle, ending the request (the client left) must free P's blocks.
    const unhold = kv ? ctx.life.holdHandle(p.release) : () => undefined;
    if (ctx.life.isEnded) {
      // it ended while P answered: end() ran the holds it had then (a release runs once)
      unhold();
      if (kv) ctx.life.background(p.release);
      throw asFailure(new Error("the request ended"), "decode", d.id);
    }
    unhold();
    try {
      const answer = await decodeAttempt(ctx, d, vllmDecodeBody(ctx.raw, kv), upstreamId);
      return { prefillNode: p.node.id, decodeNode: d.id, prefillMs: p.ms, decodeMs: answer.ms, leg: answer.leg, body: answer.body, prefillUsage: p.usage };
    } catch (err) {
      const failure = asFailure(err, "decode", d.id);
      // Released only when no D got the handle (unreachable, or refused by something in front of
      // the engine): a D that got it tells P itself, and a second word from the router would make
      // P log "Potentially invalid KV blocks for unrecognized request" (handle-release.ts). The
      // release goes to the D tried next (or this one again when there is none).
      const release = kv !== undefined && releasesUnreadHandle(decodeContact(failure, ctx.stream), ctx.decodeNotifiesP?.(d.id));
      try {
        // The handle is single-use: once a D may have read it, P may have freed or reused its
        // blocks, and a second D would answer 200 with another prompt's text. The retry re-runs
        // P for a fresh handle (on the same P: its prefix cache makes the second prefill cheap).
        await failOver(ctx, failure, attempt);
      } finally {
        if (release) ctx.life.background(p.release);
      }
    }
  }
}
