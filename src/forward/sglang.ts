import type { Role } from "../routing/types";
import { withFields } from "./body";
import { backoffMs, markReported, type ForwardContext, type ForwardResult } from "./pipeline";
import type { LegReport } from "../state/types";
import { callLeg, UpstreamFailure, type LegResponse } from "./upstream";

// SGLang PD disaggregation: P and D get the same body plus a bootstrap room and are sent at
// once; D pulls the KV from P's bootstrap server. If either leg fails, the other is aborted.

const ROOM_MASK = (1n << 63n) - 1n;

/** Random integer in [0, 2^63-1], as decimal text: it goes into JSON exactly, never through a JS number. */
export function bootstrapRoom(): string {
  const [value] = crypto.getRandomValues(new BigUint64Array(1));
  return ((value ?? 0n) & ROOM_MASK).toString();
}

export function sglangBody(raw: string, parsed: Record<string, unknown>, host: string, port: number, room: string): string {
  return withFields(raw, parsed, { bootstrap_host: JSON.stringify(host), bootstrap_port: String(port), bootstrap_room: room });
}

/** The hostname D connects to for P's bootstrap server (brackets stripped from IPv6). */
export const bootstrapHost = (url: string) => new URL(url).hostname.replace(/^\[(.*)\]$/, "$1");

export async function forwardSglang(ctx: ForwardContext): Promise<ForwardResult> {
  for (let attempt = 0; ; attempt++) {
    const p = ctx.resolve(ctx.chosen.prefill);
    const d = ctx.resolve(ctx.chosen.decode);
    const body = sglangBody(ctx.raw, ctx.parsed, bootstrapHost(p.url), p.bootstrapPort, bootstrapRoom());
    // One controller per attempt: a failed leg aborts its partner.
    const attemptAbort = new AbortController();
    const signal = AbortSignal.any([ctx.signal, attemptAbort.signal]);
    const call = (leg: Role, node: typeof p, timeoutMs: number) =>
      callLeg({ leg, node, path: ctx.path, body, requestId: ctx.requestId, signal, timeoutMs });
    const prefillStarted = Date.now();
    const prefillLeg: Promise<LegResponse> = call("prefill", p, ctx.timeouts.prefillMs);
    const decodeLeg: Promise<LegResponse> = call("decode", d, ctx.timeouts.decodeFirstByteMs);

    // P's answer is not shown to the client; when it fails, D cannot get its KV, so abort D.
    let prefillFailure: UpstreamFailure | null = null;
    const prefillSettled: Promise<LegReport | null> = prefillLeg.then(
      async (leg) => {
        await leg.response.body?.cancel();
        const ms = Date.now() - prefillStarted;
        ctx.prefillDone({ node: p.id, outcome: "ok", ms });
        return null;
      },
      (err: unknown) => {
        const failure = err instanceof UpstreamFailure ? err : new UpstreamFailure("prefill", p.id, "connect", String(err));
        prefillFailure = failure;
        attemptAbort.abort("prefill failed");
        return failure.report();
      },
    );
    try {
      const decode = await decodeLeg;
      return {
        prefillNode: p.id,
        decodeNode: d.id,
        prefillMs: 0,
        decode: { ...decode, abort: (reason) => (attemptAbort.abort(reason), decode.abort(reason)) },
        decodeMs: decode.ms,
        cachedTokens: null,
        prefillSettled,
      };
    } catch (err) {
      attemptAbort.abort("decode failed");
      await prefillSettled;
      // The leg that caused it: P when P failed first (D was aborted because of it).
      const failure: UpstreamFailure =
        prefillFailure && (prefillFailure as UpstreamFailure).kind !== "aborted"
          ? prefillFailure
          : err instanceof UpstreamFailure
            ? err
            : new UpstreamFailure("decode", d.id, "connect", String(err));
      if (failure.kind === "aborted" && ctx.signal.aborted) throw failure;
      if (!failure.retryable) throw failure;
      const role = failure.leg;
      const next = await ctx.failover(role, failure.report(), attempt < ctx.retries);
      markReported(failure);
      if (next === null || attempt >= ctx.retries) throw failure;
      ctx.chosen[role] = next;
      await ctx.sleep(backoffMs(attempt));
    }
  }
}
