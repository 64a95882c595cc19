import { BoundedMap } from "./bounded-map";

// Routing precision (SPEC 9, issue 23 item 6): of the follow-up turns of conversations (a request
// whose affinity key was seen before), the share whose engine reported cached tokens covering the
// previous turn's prompt — the turn landed on a node that still held its prefix. Counted under
// every policy (it needs only the key and the engine's usage), over the last 15 minutes.

/**
 * Engines cache whole blocks only, so a prefix "covered" is the previous prompt's whole blocks. The
 * block is taken as 512 tokens, the largest in common use (Mooncake traces, the simulator), so a
 * smaller one (vLLM's 16, SGLang's 1) only makes the test a little looser. A previous prompt
 * shorter than a block says nothing and is not judged.
 */
export const PRECISION_BLOCK_TOKENS = 512;
const WINDOW_MS = 15 * 60_000;
const BUCKET_MS = 60_000;
/** conversations remembered (the previous turn's prompt tokens): about 50 bytes each */
const CONVERSATIONS = 100_000;

interface Bucket {
  start: number;
  followUps: number;
  precise: number;
}

/** Whether a follow-up's cached tokens cover the previous prompt (null: too short to judge). */
export function coversPrevious(previousPromptTokens: number, cachedTokens: number): boolean | null {
  const blocks = Math.floor(previousPromptTokens / PRECISION_BLOCK_TOKENS);
  if (blocks < 1) return null;
  return cachedTokens >= blocks * PRECISION_BLOCK_TOKENS;
}

export class RoutingPrecision {
  readonly #previous = new BoundedMap<number>(CONVERSATIONS);
  #buckets: Bucket[] = [];

  /** The engine that prefilled a request of conversation `key` reported these tokens. */
  observe(key: string, promptTokens: number, cachedTokens: number, now: number): void {
    const previous = this.#previous.get(key);
    this.#previous.remember(key, promptTokens);
    if (previous === undefined) return;
    const covered = coversPrevious(previous, cachedTokens);
    if (covered === null) return;
    const start = now - (now % BUCKET_MS);
    let bucket = this.#buckets.at(-1);
    if (bucket?.start !== start) {
      bucket = { start, followUps: 0, precise: 0 };
      this.#buckets.push(bucket);
    }
    bucket.followUps += 1;
    if (covered) bucket.precise += 1;
    this.#drop(now);
  }

  /** Follow-ups judged and those that landed on their prefix, last 15 minutes. */
  counts(now: number): { followUps: number; precise: number } {
    this.#drop(now);
    let followUps = 0;
    let precise = 0;
    for (const b of this.#buckets) {
      followUps += b.followUps;
      precise += b.precise;
    }
    return { followUps, precise };
  }

  clear(): void {
    this.#previous.clear();
    this.#buckets = [];
  }

  #drop(now: number): void {
    while (this.#buckets.length > 0 && this.#buckets[0]!.start + BUCKET_MS <= now - WINDOW_MS) this.#buckets.shift();
  }
}
