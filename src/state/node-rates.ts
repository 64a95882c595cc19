export { DEFAULT_PROFILE, type RateProfile } from "../routing/predict";
import { DEFAULT_PROFILE, type NodeRates, prefillContextFactor, profileRates, type RateProfile } from "../routing/predict";

// Each node's rates, learned online from the legs the router runs (issue 23 item 1, SPEC 9):
// - prefill: ms per uncached token at context 0, from a prefill leg's time (P's answer, or a
//   local / colocated D's first byte less one decode step) over the work it covered — its own
//   uncached tokens (the engine's prompt minus cached tokens when it reported them) plus the
//   prefill work already running on the node when it was sent, each weighted by attention over
//   its own context (predict.ts prefillContextFactor; leases.ts prefillCostOf);
// - decode: ms a step against the batch (a line: the step of one sequence, plus ms a sequence),
//   from the gaps between the tokens of a stream the relay passed and the sequences decoding on
//   its node when it ended (a decayed least-squares fit, the prior two points on a flat line). An
//   event may carry several tokens (vLLM and SGLang `--stream-interval`: the first token at once,
//   then one event every N, vllm/v1/engine/output_processor.py make_request_output; Dynamo's
//   vLLM frontend streams 20 at a time by default; vLLM merges outputs a slow reader has not
//   taken): a stream whose usage frame counts its tokens is timed by its tokens and teaches its
//   node's tokens an event, which times the node's streams without one;
// - transfer: D's first byte less P's answer and D's first step, as a line against the tokens D
//   lacked (a decayed least-squares fit over requests): ms a token, and a fixed hand-off. In the
//   agentic run most of that time did not grow with the tokens (2026-12-02, docs/predicted.md:
//   D's first byte was a median 300-700 ms whatever the size), and a per-token rate alone made
//   long prompts' predictions several times too long and short ones' too short.
// - tokens a request decodes: the mean over every stream of the cluster (one figure, not a node's:
//   it is the workload's), over a longer half-life (the agentic outputs are heavy-tailed: median
//   80, mean 445), the prior 256 tokens worth two requests.
// Each is a ratio of time-decayed sums with the document's `profile` as a prior worth a few
// requests: a node made twice as slow, or restarted, is learned within a minute of traffic, and an
// idle node drifts back to its profile. Plain data, the clock passed in.

/** a sample's weight halves every this many ms: a rate 2x off is mostly forgotten after ~4 half-lives */
export const RATE_HALF_LIFE_MS = 10_000;
/** the prior's weight, in the unit of each rate's samples: about two 1,000-token prefills, 20 decode steps (the transfer's: two requests, transferLine) */
const PRIOR_WEIGHT = { prefill: 2_000, decode: 20, output: 2 } as const;
/** the half-life of the mean tokens a request decodes, and of a node's tokens an event (ms) */
const OUTPUT_HALF_LIFE_MS = 60_000;
/** the most tokens an event is believed to carry (a stream interval of 20 is Dynamo's default; a slow reader's merged outputs carry more) */
const MAX_TOKENS_AN_EVENT = 1024;
/** the prior of a node's tokens an event (one) is worth one event's gap: a single stream with a usage frame outweighs it */
const PRIOR_EVENT_GAPS = 1;

type Kind = "prefill";

interface Decayed {
  /** weighted sum of the samples (ms) and their weight (tokens or steps), decayed to `at` */
  ms: number;
  weight: number;
  at: number;
}

/** One finished request's figures, as the object has them at its end. */
export interface LegSample {
  /** the node that prefilled (P; D when it served alone) and the decode node */
  prefiller: string;
  decode: string;
  /** disaggregated: P then D, so D's first byte waited for the KV it lacked */
  disaggregated: boolean;
  /** prefill work running on the prefilling node when the request was sent (its queue), in tokens at context 0 (NodeLoad.prefillCost) */
  aheadCost: number;
  /** the prompt's tokens and those the prefilling node had cached (the engine's, else the router's prediction) */
  promptTokens: number;
  cachedTokens: number;
  /** the KV tokens D lacked (pulled from P) */
  transferTokens: number;
  /** P's answer (ms; absent: none, or it ran beside D), and the client's time to first token from the decision (ms) */
  prefillMs?: number | undefined;
  ttftMs?: number | undefined;
  /** sequences decoding on D when the request ended, itself included */
  batch?: number | undefined;
  /** a stream's data events and the ms between its first and last */
  streamEvents?: number | undefined;
  streamSpanMs?: number | undefined;
  /** the stream's output tokens, when its usage frame reported them */
  streamTokens?: number | undefined;
  /** its events are not its tokens' (a Responses stream's item and part events): it teaches no tokens an event */
  streamEventsNotTokens?: boolean | undefined;
}

const decayFit = (d: StepFit, now: number): void => {
  if (now <= d.at) return;
  const f = 0.5 ** ((now - d.at) / RATE_HALF_LIFE_MS);
  d.w *= f;
  d.wx *= f;
  d.wy *= f;
  d.wxx *= f;
  d.wxy *= f;
  d.at = now;
};

const decayTo = (d: Decayed, now: number, halfLife = RATE_HALF_LIFE_MS): void => {
  if (now <= d.at) return;
  const f = 0.5 ** ((now - d.at) / halfLife);
  d.ms *= f;
  d.weight *= f;
  d.at = now;
};

/** Decayed sums of a weighted least-squares line: step ms (y) against sequences decoding (x). */
interface StepFit {
  w: number;
  wx: number;
  wy: number;
  wxx: number;
  wxy: number;
  at: number;
}

/** The prior's two points: a flat line at the profile's step, from one sequence to this many */
const PRIOR_BATCH = 33;
/** The transfer prior's two points, a request's weight each: the prior hand-off alone, and with the profile's rate at this many tokens */
const PRIOR_TRANSFER_TOKENS = 10_000;

/**
 * D's hand-off (ms) and ms a token, fitted with the prior's points added (the hand-off never below
 * 0, the rate never below 1 % of the prior's). The prior hand-off is one of D's steps: a decode leg
 * meets D's step loop twice besides its first step — its blocks are taken and its pull started at
 * the next step, and a pull that landed is seen at the step after the one it landed in (vLLM's
 * scheduler reads finished receives from the previous step's output:
 * vllm/v1/core/sched/scheduler.py `_update_waiting_for_remote_kv`), half a step each on average.
 */
function transferLine(fit: StepFit | undefined, priorMsPerToken: number, priorHandoffMs: number): { handoffMs: number; msPerToken: number } {
  if (!fit || !(fit.w > 0)) return { handoffMs: priorHandoffMs, msPerToken: priorMsPerToken };
  const floor = priorMsPerToken / 100;
  const w = (fit?.w ?? 0) + 2;
  const wx = (fit?.wx ?? 0) + PRIOR_TRANSFER_TOKENS;
  const wy = (fit?.wy ?? 0) + 2 * priorHandoffMs + priorMsPerToken * PRIOR_TRANSFER_TOKENS;
  const wxx = (fit?.wxx ?? 0) + PRIOR_TRANSFER_TOKENS * PRIOR_TRANSFER_TOKENS;
  const wxy = (fit?.wxy ?? 0) + (priorHandoffMs + priorMsPerToken * PRIOR_TRANSFER_TOKENS) * PRIOR_TRANSFER_TOKENS;
  const den = w * wxx - wx * wx;
  let msPerToken = den > 0 ? Math.max(floor, (w * wxy - wx * wy) / den) : priorMsPerToken;
  let handoffMs = (wy - msPerToken * wx) / w;
  if (handoffMs < 0) {
    // a line through 0: all of it per token
    handoffMs = 0;
    msPerToken = wxx > 0 ? Math.max(floor, wxy / wxx) : priorMsPerToken;
  }
  return { handoffMs, msPerToken };
}

/** The fitted step at one sequence and its growth a sequence, with the prior's points added (never below 0). */
function stepLine(fit: StepFit | undefined, priorMs: number): { at1: number; perSeq: number } {
  const half = PRIOR_WEIGHT.decode / 2;
  const w = (fit?.w ?? 0) + 2 * half;
  const wx = (fit?.wx ?? 0) + half * (1 + PRIOR_BATCH);
  const wy = (fit?.wy ?? 0) + 2 * half * priorMs;
  const wxx = (fit?.wxx ?? 0) + half * (1 + PRIOR_BATCH * PRIOR_BATCH);
  const wxy = (fit?.wxy ?? 0) + half * priorMs * (1 + PRIOR_BATCH);
  const den = w * wxx - wx * wx;
  const perSeq = den > 0 ? Math.max(0, (w * wxy - wx * wy) / den) : 0;
  const at1 = (wy - perSeq * wx) / w + perSeq;
  return { at1: Math.max(0.01, at1), perSeq };
}

export class NodeRateTable {
  readonly #byNode = new Map<string, Record<Kind, Decayed>>();
  readonly #steps = new Map<string, StepFit>();
  readonly #transfers = new Map<string, StepFit>();
  /** each node's streams with a usage frame: the gaps between their tokens (ms) and between their events (weight) */
  readonly #perEvent = new Map<string, Decayed>();
  /** the cluster's streams: tokens decoded (ms) a request (weight) */
  readonly #output: Decayed = { ms: 0, weight: 0, at: 0 };

  /** Learns from one finished request (only the parts it measured). */
  learn(s: LegSample, now: number, profileOf: (node: string) => RateProfile): void {
    const d = this.view(s.decode, profileOf(s.decode), now);
    const batch = Math.max(1, s.batch ?? 1);
    const step = d.decodeStepMs + d.decodeMsPerSeq * (batch - 1);
    if (s.streamEvents !== undefined && s.streamSpanMs !== undefined && s.streamEvents >= 3 && s.streamSpanMs > 0) {
      // the gaps between a stream's tokens: its usage frame's count, else its events times the
      // node's tokens an event ([DONE] follows the last token at once: an event's gap fewer)
      let gaps: number;
      // a count no engine's events could carry (over MAX_TOKENS_AN_EVENT each) is not believed
      if (s.streamTokens !== undefined && s.streamTokens >= 2 && s.streamTokens <= s.streamEvents * MAX_TOKENS_AN_EVENT) {
        gaps = s.streamTokens - 1;
        // its events' gaps: the usage frame is one more event (never below a token an event)
        const eventGaps = s.streamEvents - 3;
        if (eventGaps > 0 && !s.streamEventsNotTokens) this.#addTokensPerEvent(s.decode, Math.max(gaps, eventGaps), eventGaps, now);
      } else gaps = (s.streamEvents - 2) * this.tokensPerEvent(s.decode, now);
      this.#addStep(s.decode, s.streamSpanMs / gaps, gaps, batch, now);
      decayTo(this.#output, now, OUTPUT_HALF_LIFE_MS);
      this.#output.ms += gaps + 1;
      this.#output.weight += 1;
    }
    const uncached = Math.max(0, s.promptTokens - s.cachedTokens);
    const work = Math.max(0, s.aheadCost) + uncached * prefillContextFactor(s.cachedTokens + uncached / 2);
    if (s.disaggregated) {
      if (s.prefillMs !== undefined && s.prefillMs > 0 && uncached > 0) this.#add(s.prefiller, "prefill", s.prefillMs, work, now);
      if (s.ttftMs !== undefined && s.transferTokens > 0) {
        const transferMs = s.ttftMs - (s.prefillMs ?? 0) - step;
        if (transferMs > 0) this.#addPoint(this.#transfers, s.decode, s.transferTokens, transferMs, 1, now);
      }
    } else if (s.ttftMs !== undefined && uncached > 0) {
      // D prefilled alone: its first byte is its prefill and one step
      const prefillMs = s.ttftMs - step;
      if (prefillMs > 0) this.#add(s.prefiller, "prefill", prefillMs, work, now);
    }
  }

  /** The node's rates now: what it showed, the prior where it showed little. */
  view(node: string, profile: RateProfile, now: number): NodeRates {
    const own = this.#byNode.get(node);
    const prior = profileRates(profile);
    const rate = (kind: Kind, priorRate: number): number => {
      const d = own?.[kind];
      if (d) decayTo(d, now);
      const w = PRIOR_WEIGHT[kind];
      return ((d?.ms ?? 0) + priorRate * w) / ((d?.weight ?? 0) + w);
    };
    const fit = this.#steps.get(node);
    if (fit) decayFit(fit, now);
    const step = stepLine(fit, prior.decodeStepMs);
    const tfit = this.#transfers.get(node);
    if (tfit) decayFit(tfit, now);
    const transfer = transferLine(tfit, prior.transferMsPerToken, step.at1);
    const out = this.#output;
    decayTo(out, now, OUTPUT_HALF_LIFE_MS);
    return {
      prefillMsPerToken: rate("prefill", prior.prefillMsPerToken),
      decodeStepMs: step.at1,
      decodeMsPerSeq: step.perSeq,
      transferMsPerToken: transfer.msPerToken,
      handoffMs: transfer.handoffMs,
      decodeTokens: (out.ms + prior.decodeTokens! * PRIOR_WEIGHT.output) / (out.weight + PRIOR_WEIGHT.output),
    };
  }

  /** The node's tokens an event, learned from its streams with a usage frame (1 until one showed more). */
  tokensPerEvent(node: string, now: number): number {
    const d = this.#perEvent.get(node);
    if (d) decayTo(d, now, OUTPUT_HALF_LIFE_MS);
    return ((d?.ms ?? 0) + PRIOR_EVENT_GAPS) / ((d?.weight ?? 0) + PRIOR_EVENT_GAPS);
  }

  #addTokensPerEvent(node: string, tokens: number, events: number, now: number): void {
    let d = this.#perEvent.get(node);
    if (!d) {
      d = { ms: 0, weight: 0, at: now };
      this.#perEvent.set(node, d);
    }
    decayTo(d, now, OUTPUT_HALF_LIFE_MS);
    d.ms += tokens;
    d.weight += events;
  }

  forget(node: string): void {
    this.#perEvent.delete(node);
    this.#byNode.delete(node);
    this.#steps.delete(node);
    this.#transfers.delete(node);
  }

  clear(): void {
    Object.assign(this.#output, { ms: 0, weight: 0 });
    this.#byNode.clear();
    this.#perEvent.clear();
    this.#steps.clear();
    this.#transfers.clear();
  }

  #addStep(node: string, stepMs: number, steps: number, batch: number, now: number): void {
    if (!(stepMs > 0) || !Number.isFinite(stepMs) || !(steps > 0)) return;
    this.#addPoint(this.#steps, node, batch, stepMs, steps, now);
  }

  /** One point (x, y) of weight `w` into a node's decayed least-squares sums. */
  #addPoint(fits: Map<string, StepFit>, node: string, x: number, y: number, w: number, now: number): void {
    let fit = fits.get(node);
    if (!fit) {
      fit = { w: 0, wx: 0, wy: 0, wxx: 0, wxy: 0, at: now };
      fits.set(node, fit);
    }
    decayFit(fit, now);
    fit.w += w;
    fit.wx += w * x;
    fit.wy += w * y;
    fit.wxx += w * x * x;
    fit.wxy += w * x * y;
  }

  #add(node: string, kind: Kind, ms: number, weight: number, now: number): void {
    if (!(ms > 0) || !(weight > 0) || !Number.isFinite(ms / weight)) return;
    let rates = this.#byNode.get(node);
    if (!rates) {
      rates = { prefill: { ms: 0, weight: 0, at: now } };
      this.#byNode.set(node, rates);
    }
    const d = rates[kind];
    decayTo(d, now);
    d.ms += ms;
    d.weight += weight;
  }
}

/** The node's profile: its own fields over the pool's over the defaults. */
export function profileOf(pool: Partial<RateProfile> | undefined, node: Partial<RateProfile> | undefined): RateProfile {
  return { ...DEFAULT_PROFILE, ...pool, ...node };
}
