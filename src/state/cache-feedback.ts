import type { Role } from "../routing/types";

// Cache-hit feedback (issue 17 item 2): every engine answer says how many of the prompt's tokens
// it had cached (`prompt_tokens_details.cached_tokens`); the router predicted a number from its
// prefix index when it routed the request. The two are counted per node (/metrics), and a node
// whose answers show it lost what the index says it holds has its entries dropped — the failure
// of an index that keeps a restarted or reset engine's blocks and routes traffic to a cold node
// (llm-d/llm-d-inference-scheduler#2853; vllm-project/aibrix#2287: `/reset_prefix_cache`, an OOM
// reset or `/sleep` wipe the cache while the pod stays up and healthy).

/** What the router predicted for the node that prefills a request, kept with its lease. */
export interface CachePrediction {
  node: string;
  /** the prefix index the prediction came from (P's, or D's when D prefills) */
  role: Role;
  /** the request's prefix block hashes and how many leading ones the node was believed to hold */
  hashes: string[];
  /** the last block's hash of a prompt longer than the head kept in `hashes` (its end entry) */
  endHash?: string;
  matched: number;
  promptChars: number;
  blockChars: number;
}

/** What the engine answered: its prompt tokens and how many of them it had cached. */
export interface EngineUsage {
  node: string;
  promptTokens: number;
  cachedTokens: number;
  /** the engine reported impossible figures (clamped): counted against it, nothing learned */
  anomaly?: boolean;
}

/** A prediction of at least this many blocks is one a miss says something about. */
export const MIN_PREDICTED_BLOCKS = 2;
/**
 * Answers in a row that found at most a quarter of a well-predicted prefix before the node counts
 * as having lost its cache: a restart or reset empties it for every prefix at once, while an LRU
 * eviction of one long-idle conversation is a miss among hits. Measured on the Mooncake trace
 * (docs/benchmark-results.md, the trace with a restart): 3 in a row judged only the restarted node lost with 5,000-block
 * caches (2 in a row also fired on four nodes that had only evicted); under heavy eviction
 * (1,000 blocks) it fires often, and that keeps the index near what the engines hold.
 */
export const LOST_AFTER_MISSES = 3;

export type CacheVerdict = "hit" | "partial" | "miss" | "unjudged";

/**
 * One answer against its prediction, in blocks (`heldBlocks`: the leading blocks the engine's
 * cached tokens cover). `zeroMeansZero`: the node has reported cached tokens before, so an answer
 * without them means none (vLLM omits the field when the count is 0 and when
 * --enable-prompt-tokens-details is off; only the first is a miss).
 */
export function judge(predictedBlocks: number, heldBlocks: number, zeroMeansZero: boolean): CacheVerdict {
  if (predictedBlocks < MIN_PREDICTED_BLOCKS) return "unjudged";
  if (heldBlocks >= predictedBlocks / 2) return "hit";
  if (heldBlocks === 0 && !zeroMeansZero) return "unjudged";
  // Far less than predicted: at most a quarter of it. Not "none": after a restart the prompt every
  // request shares (a system prompt) is cached again at once, so a restarted node's answers still
  // find its first block or two (measured on the Mooncake trace: docs/benchmark-results.md, the trace with a restart).
  return heldBlocks <= predictedBlocks / 4 ? "miss" : "partial";
}

interface NodeFeedback {
  predictedTokens: number;
  cachedTokens: number;
  /** answers in a row whose verdict was "miss" */
  missStreak: number;
  /** the node has reported cached tokens at least once */
  everCached: boolean;
  /** times the node was taken to have lost its cache */
  cacheLost: number;
}

const fresh = (): NodeFeedback => ({ predictedTokens: 0, cachedTokens: 0, missStreak: 0, everCached: false, cacheLost: 0 });

/** The outcome of one report: the predicted tokens counted, and whether the node lost its cache. */
export interface FeedbackOutcome {
  predictedTokens: number;
  verdict: CacheVerdict;
  /** forget every prefix-index entry of the node (then record this prompt again: it just computed it) */
  cacheLost: boolean;
}

/** Per node: predicted vs reported cached tokens, and the run of misses that says its cache is gone. */
export class CacheFeedback {
  readonly #byNode = new Map<string, NodeFeedback>();

  /**
   * `corrects: false` counts and judges the answers but never says a node lost its cache, so the
   * index is never corrected: the benchmark's "without feedback" (TEST_CACHE_FEEDBACK=count_only).
   */
  constructor(private readonly corrects = true) {}

  /**
   * An engine answered for a request the router predicted for (`charsPerToken`: the node's rate
   * at routing time). Counts both figures and judges the answer.
   */
  report(prediction: CachePrediction, usage: EngineUsage, charsPerToken: number): FeedbackOutcome {
    const f = this.#byNode.get(usage.node) ?? fresh();
    this.#byNode.set(usage.node, f);
    const blockTokens = prediction.blockChars / Math.max(1e-9, charsPerToken);
    const predictedChars = Math.min(prediction.promptChars, prediction.matched * prediction.blockChars);
    const predictedTokens = Math.min(Math.max(0, usage.promptTokens), Math.round(predictedChars / Math.max(1e-9, charsPerToken)));
    const cached = Math.max(0, usage.cachedTokens);
    f.predictedTokens += predictedTokens;
    f.cachedTokens += cached;
    const verdict = judge(prediction.matched, Math.floor(cached / blockTokens + 1e-9), f.everCached);
    if (cached > 0) f.everCached = true;
    if (verdict === "miss") f.missStreak += 1;
    else if (verdict !== "unjudged") f.missStreak = 0;
    const cacheLost = this.corrects && f.missStreak >= LOST_AFTER_MISSES;
    if (cacheLost) {
      f.missStreak = 0;
      f.cacheLost += 1;
    }
    return { predictedTokens, verdict, cacheLost };
  }

  /**
   * An engine answered for a request the router predicted nothing for (no prefix index under its
   * policy): its cached tokens still count (SPEC 8: `pd_router_prefix_cached_tokens_total` counts
   * what engines report under every policy).
   */
  count(usage: EngineUsage): void {
    const f = this.#byNode.get(usage.node) ?? fresh();
    this.#byNode.set(usage.node, f);
    f.cachedTokens += Math.max(0, usage.cachedTokens);
  }

  /** Predicted and reported cached tokens summed, and cache losses, for /metrics. */
  totals(node: string): { predictedTokens: number; cachedTokens: number; cacheLost: number } {
    const f = this.#byNode.get(node);
    return { predictedTokens: f?.predictedTokens ?? 0, cachedTokens: f?.cachedTokens ?? 0, cacheLost: f?.cacheLost ?? 0 };
  }

  forget(node: string): void {
    this.#byNode.delete(node);
  }

  clear(): void {
    this.#byNode.clear();
  }
}
