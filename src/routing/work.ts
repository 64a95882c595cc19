// A request's size in tokens for one node, and in-flight load counted in work rather than in
// requests (issue 17 item 4). Pure: the prefix matches, the node's characters per token and the
// in-flight tokens come from the Durable Object.
//
// The engines feel load in tokens: a P is as busy as the prompt tokens it must compute (those it
// has not cached), a D as the KV tokens it holds. Dynamo's KV router scores a worker by exactly
// these (ai-dynamo/dynamo lib/kv-router/src/scheduling/selector.rs: logit = overlap_score_weight *
// potential_prefill_blocks + decode_blocks, prefill blocks counting only the uncached part), and
// SGLang's PD router weighs a decode node by its token usage (kv-guard.ts).

/** Characters a token before a node has reported any (llm-d's AverageCharactersPerToken is 4 too). */
export const DEFAULT_CHARS_PER_TOKEN = 4;

const cptOf = (charsPerToken: number | undefined): number => (charsPerToken !== undefined && charsPerToken > 0 ? charsPerToken : DEFAULT_CHARS_PER_TOKEN);

/** The prompt's tokens for a node reading `charsPerToken` characters a token (0 when its size is unknown). */
export function promptTokensOf(promptChars: number, charsPerToken?: number): number {
  return promptChars > 0 ? Math.max(1, Math.ceil(promptChars / cptOf(charsPerToken))) : 0;
}

/**
 * Tokens of the prompt a node holding its first `matchedBlocks` prefix blocks of `blockChars`
 * characters has not cached: what it must compute (or pull) for this request.
 */
export function uncachedTokensOf(promptChars: number, matchedBlocks: number, blockChars: number, charsPerToken?: number): number {
  if (!(promptChars > 0)) return 0;
  const cachedChars = Math.min(promptChars, Math.max(0, Math.floor(matchedBlocks)) * Math.max(0, blockChars));
  return Math.ceil((promptChars - cachedChars) / cptOf(charsPerToken));
}

/**
 * In-flight requests weighted by their work: each node's in-flight tokens divided by the mean
 * tokens of one in-flight request over `members` (the nodes that may take work). Over the members
 * the weighted loads sum to their request count, so bounded load's bounds, computed over the same
 * sum, still leave some member under its own; a node that holds two long cold prompts counts more
 * than two, one holding two cached turns less. Without work figures (or nothing in flight) it is
 * the request count itself.
 */
export function workWeightedLoads(nodes: ReadonlyArray<{ load: number; work?: number | undefined }>, members: ReadonlyArray<boolean>): number[] {
  let count = 0;
  let work = 0;
  let known = true;
  nodes.forEach((n, i) => {
    if (!members[i]) return;
    if (n.work === undefined) known = false;
    count += Math.max(0, n.load);
    work += Math.max(0, n.work ?? 0);
  });
  if (!known || !(count > 0) || !(work > 0)) return nodes.map((n) => Math.max(0, n.load));
  const perRequest = work / count;
  return nodes.map((n) => (n.work === undefined ? Math.max(0, n.load) : Math.max(0, n.work) / perRequest));
}
