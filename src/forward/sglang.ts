import type { LegReport } from "../state/types";
import { withFields } from "./body";
import { asFailure, decodeAttempt, failOver, sendLeg, type DecodeAnswer, type ForwardContext } from "./pipeline";
import { sseReader } from "./sse-reader";
import type { Leg, UpstreamFailure, UpstreamNode } from "./upstream";

// SGLang PD disaggregation: P and D get the same body plus a bootstrap room and are sent at
// once; D pulls the KV from P's bootstrap server. If either leg fails, the other is aborted.
// P's answer is read to its end and never dropped early: SGLang aborts a request whose HTTP
// connection closes (sgl-project/sglang python/sglang/srt/entrypoints/http_server.py, the
// disconnect check of its streaming response; then D fails its KV transfer).

const ROOM_MASK = (1n << 63n) - 1n;

/** How long a D that reported an error as its first event waits for P's leg to tell whether P failed. */
export const PARTNER_SETTLE_MS = 1_000;
const noop = () => undefined;

/** Random integer in [0, 2^63-1], as decimal text: it goes into JSON exactly, never through a JS number. */
export function bootstrapRoom(): string {
  const [value] = crypto.getRandomValues(new BigUint64Array(1));
  return ((value ?? 0n) & ROOM_MASK).toString();
}

export function sglangBody(raw: string, host: string, port: number, room: string): string {
  return withFields(raw, { bootstrap_host: JSON.stringify(host), bootstrap_port: String(port), bootstrap_room: room });
}

/**
 * Runs P's leg to the end of its answer (headers, then the body, within prefillMs) beside D's:
 * P's body text when it went well, else throws its failure. `onFail` (given P's failure) aborts
 * the partner D. A stream P answers with an error event failed too: SGLang sends its stream's
 * headers at once, so a prefill that fails later (a KV transfer that broke) can only say so in
 * the stream (sgl-project/sglang entrypoints/openai/serving_chat.py, serving_completions.py:
 * `create_streaming_error_response` then `[DONE]`).
 */
export function runConcurrentPrefill(
  ctx: ForwardContext,
  p: UpstreamNode,
  body: string,
  upstreamId: string,
  signal: AbortSignal,
  onFail: (failure: UpstreamFailure) => void,
  headers?: Record<string, string>,
): Promise<string> {
  const started = Date.now();
  return sendLeg(ctx, "prefill", p, body, upstreamId, ctx.timeouts.prefillMs, signal, headers)
    .then(async (leg: Leg) => {
      let text: string;
      try {
        text = await leg.text();
      } finally {
        leg.close();
      }
      const error = (leg.response.headers.get("content-type") ?? "").includes("text/event-stream") ? streamErrorOf(text) : null;
      if (error !== null) throw leg.protocolFailure(`sent an error event: ${error}`);
      ctx.life.prefillDone({ node: p.id, outcome: "ok", ms: Date.now() - started });
      return text;
    })
    .catch((err: unknown) => {
      const failure = asFailure(err, "prefill", p.id);
      onFail(failure);
      // P's part of the lease ends here; the failure itself is counted once, by failover or finish
      ctx.life.prefillDone({ node: p.id, outcome: "aborted" });
      throw failure;
    });
}

/** The error event in P's streamed answer (SGLang writes one when it aborted the request), read by the one SSE reader; null when none. */
function streamErrorOf(text: string): string | null {
  const reader = sseReader({ kind: "done" });
  const error = reader.feed(new TextEncoder().encode(text)).error ?? reader.end().error;
  return error?.message ?? null;
}

/** The bodies of one concurrent attempt, and what to do with P's answer when it arrives. */
export interface ConcurrentLegs {
  prefill: string;
  decode: string;
  /** headers P's leg adds (vllm-mooncake: the data-parallel rank) */
  prefillHeaders?: Record<string, string>;
  onPrefillAnswer?(text: string): void;
  /**
   * The attempt failed (either leg), after failover moved on: e.g. forget what was learned about
   * P, release what P holds for a D that never got the request. `prefillAnswered`: P's whole
   * answer arrived (its prefill finished) before the attempt was given up.
   */
  onFailure?(decode: UpstreamFailure, prefillAnswered: boolean): void;
}

/**
 * P and D sent at once (sglang, vllm-mooncake), with failover: a failed leg aborts its
 * partner, and the leg that failed first is blamed and replaced.
 */
export async function forwardConcurrent(
  ctx: ForwardContext,
  legs: (p: UpstreamNode, d: UpstreamNode, upstreamId: string) => Promise<ConcurrentLegs> | ConcurrentLegs,
  prefillUsage: DecodeAnswer["prefillUsage"] = null,
): Promise<DecodeAnswer> {
  for (let attempt = 0; ; attempt++) {
    const p = ctx.resolve(ctx.life.chosen.prefill);
    const d = ctx.resolve(ctx.life.chosen.decode);
    const upstreamId = ctx.life.upstreamId();
    let bodies: ConcurrentLegs;
    try {
      bodies = await legs(p, d, upstreamId);
    } catch (err) {
      await failOver(ctx, asFailure(err, "prefill", p.id), attempt);
      continue;
    }
    // P's failure aborts this attempt's D (it would wait for KV that never comes); D's failure
    // aborts this attempt's P (its KV would serve nobody).
    const prefillAbort = new AbortController();
    const decodeAbort = new AbortController();
    let prefillFailed = false;
    /** P's own failure (not an abort): once D's answer went out, the relay ends with it instead of a clean cut */
    let partnerFailure: UpstreamFailure | null = null;
    const prefill = runConcurrentPrefill(
      ctx,
      p,
      bodies.prefill,
      upstreamId,
      AbortSignal.any([ctx.life.signal, prefillAbort.signal]),
      (failure) => {
        prefillFailed = true;
        if (failure.kind !== "aborted") partnerFailure = failure;
        decodeAbort.abort("prefill failed");
      },
      bodies.prefillHeaders,
    );
    const prefillReport: Promise<LegReport | null> = prefill.then(
      (text) => {
        bodies.onPrefillAnswer?.(text);
        return null;
      },
      (f: UpstreamFailure) => f.report(),
    );
    try {
      const answer = await decodeAttempt(ctx, d, bodies.decode, upstreamId, AbortSignal.any([ctx.life.signal, decodeAbort.signal]));
      // P is still finishing its answer: the request reports it when it settles. Should P fail
      // now, D's leg is aborted and the relay ends the stream with P's failure (partnerFailure).
      ctx.life.awaitPrefill(prefillReport);
      return {
        prefillNode: p.id,
        decodeNode: d.id,
        prefillMs: 0,
        decodeMs: answer.ms,
        leg: answer.leg,
        body: answer.body,
        prefillUsage,
        partnerFailure: () => partnerFailure,
      };
    } catch (err) {
      const decodeFailure = asFailure(err, "decode", d.id);
      // D's first event was an error: SGLang's decode writes one when its KV transfer failed,
      // which is P's doing when P failed or aborted the request; P's leg says so about when D
      // does. Given a moment, P is blamed when P failed, else D.
      if (decodeFailure.errorEvent && decodeFailure.outcome === "failure" && !prefillFailed) {
        await Promise.race([prefill.then(noop, noop), ctx.sleep(PARTNER_SETTLE_MS)]);
      }
      prefillAbort.abort("decode failed");
      // Blame the leg that failed first: P, when D was only aborted because of it.
      const failure = prefillFailed
        ? await prefill.then(
            () => decodeFailure,
            (f: UpstreamFailure) => (f.kind === "aborted" ? decodeFailure : f),
          )
        : decodeFailure;
      const prefillAnswered = (await prefillReport) === null;
      try {
        await failOver(ctx, failure, attempt);
      } finally {
        bodies.onFailure?.(decodeFailure, prefillAnswered);
      }
    }
  }
}

/** A batched native /generate (a list of texts or of token lists): one room per item, as SGLang's router sends it. */
function generateBatchSize(parsed: Record<string, unknown>): number | null {
  const text = parsed.text;
  const ids = parsed.input_ids;
  if (Array.isArray(text)) return text.length;
  if (Array.isArray(ids) && Array.isArray(ids[0])) return ids.length;
  return null;
}

export function forwardSglang(ctx: ForwardContext): Promise<DecodeAnswer> {
  return forwardConcurrent(ctx, (p) => {
    const batch = ctx.path === "/generate" ? generateBatchSize(ctx.parsed) : null;
    // P's bootstrapHost (default its URL's host), an IPv6 literal in brackets: SGLang's decode
    // builds `http://{bootstrap_host}:{bootstrap_port}/route` from it (older releases join the
    // two with a bare f-string, newer ones through NetworkAddress, which accepts brackets;
    // sgl-project/sglang python/sglang/srt/disaggregation/decode.py `_bootstrap_addr`,
    // common/conn.py `_get_bootstrap_info_from_server`), so a bare IPv6 literal breaks it.
    const host = p.bootstrapHost;
    // sgl-project/sglang's router (pd_router.rs inject_bootstrap_into_value) writes arrays for a batch
    const body =
      batch === null
        ? sglangBody(ctx.raw, host, p.bootstrapPort, bootstrapRoom())
        : withFields(ctx.raw, {
            bootstrap_host: JSON.stringify(Array(batch).fill(host)),
            bootstrap_port: JSON.stringify(Array(batch).fill(p.bootstrapPort)),
            bootstrap_room: `[${Array.from({ length: batch }, bootstrapRoom).join(",")}]`,
          });
    return { prefill: body, decode: body };
  });
}
