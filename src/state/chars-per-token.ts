import { DEFAULT_CHARS_PER_TOKEN } from "../routing/work";

/** Bounds of a learned rate: ~1 for CJK text or digits, ~4 for English, rarely above 6; a wild sample cannot take it outside. */
export const CHARS_PER_TOKEN_MIN = 1;
export const CHARS_PER_TOKEN_MAX = 8;
/** each answer's weight fades by this factor per later answer: ~70 answers to half (smoothing) */
const DECAY = 0.99;
/** the prior counts as this many tokens at DEFAULT_CHARS_PER_TOKEN, so a few answers do not swing it */
const PRIOR_TOKENS = 2_000;
/** a node's own rate is used once its answers carry this many tokens; before, the pool's */
const OWN_RATE_AFTER_TOKENS = 4_000;

interface Rate {
  chars: number;
  tokens: number;
  /** tokens observed in all (undecayed): enough to trust the node's own rate */
  seen: number;
}

const prior = (): Rate => ({ chars: PRIOR_TOKENS * DEFAULT_CHARS_PER_TOKEN, tokens: PRIOR_TOKENS, seen: 0 });

/**
 * Characters of the router's canonical prompt text per token of each node's answers (cache-hit
 * feedback, issue 17 item 2): the prompt's characters over the `prompt_tokens` its engine reported,
 * as decayed sums (a ratio of sums: long prompts weigh by their size), within [1, 8]. The
 * canonical text is not what the engine tokenizes (chat templates add tokens), and the rate
 * absorbs that too. A node that has not answered enough yet borrows the pool's rate.
 */
export class CharsPerToken {
  readonly #byNode = new Map<string, Rate>();
  #pool: Rate = prior();

  /** A node answered a prompt of `chars` characters with `tokens` prompt tokens. */
  observe(node: string, chars: number, tokens: number): void {
    if (!(chars > 0) || !(tokens > 0) || !Number.isFinite(chars / tokens)) return;
    // a sample outside the bounds counts as at the bound (token-id prompts, images: no text to speak of)
    chars = Math.min(tokens * CHARS_PER_TOKEN_MAX, Math.max(tokens * CHARS_PER_TOKEN_MIN, chars));
    const rate = this.#byNode.get(node) ?? prior();
    this.#byNode.set(node, rate);
    add(rate, chars, tokens);
    add(this.#pool, chars, tokens);
  }

  /** The node's rate, the pool's until the node's own is established. */
  of(node: string): number {
    const own = this.#byNode.get(node);
    return own && own.seen >= OWN_RATE_AFTER_TOKENS ? rateOf(own) : rateOf(this.#pool);
  }

  forget(node: string): void {
    this.#byNode.delete(node);
  }

  clear(): void {
    this.#byNode.clear();
    this.#pool = prior();
  }
}

function add(rate: Rate, chars: number, tokens: number): void {
  rate.chars = rate.chars * DECAY + chars;
  rate.tokens = rate.tokens * DECAY + tokens;
  rate.seen += tokens;
}

function rateOf(rate: Rate): number {
  return Math.min(CHARS_PER_TOKEN_MAX, Math.max(CHARS_PER_TOKEN_MIN, rate.chars / rate.tokens));
}
