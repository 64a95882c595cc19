import { PrefixIndex } from "../routing/prefix-index";
import type { CacheAwareParams, CandidateNode, Decision, Role, SelectionInput } from "../routing/types";
import { CacheFeedback, type CachePrediction, type EngineUsage } from "./cache-feedback";
import { CharsPerToken } from "./chars-per-token";
import type { NodeLease } from "./leases";
import type { ClusterView, NodeStatus, RouteRequest } from "./types";

/** per role; ~130 bytes an entry (prefix-index.ts): ~26 MB for both */
export const PREFIX_INDEX_ENTRIES = 100_000;
const ROLES = ["prefill", "decode"] as const;

/**
 * What the router believes each node's prefix cache holds, and what the engines' answers teach it
 * (cache-hit feedback, issue 17 item 5): one prefix index per pool, each node's characters per
 * token, and predicted vs reported cached tokens. A node of role `both` has one cache, so each
 * pool's index learns what it holds.
 */
export class PrefixMemory {
  readonly index: Record<Role, PrefixIndex>;
  readonly rates = new CharsPerToken();
  readonly feedback: CacheFeedback;

  /** `corrects: false` only counts (CacheFeedback says why) */
  constructor(maxEntries = PREFIX_INDEX_ENTRIES, corrects = true) {
    this.index = { prefill: new PrefixIndex(maxEntries), decode: new PrefixIndex(maxEntries) };
    this.feedback = new CacheFeedback(corrects);
  }

  /** For each candidate of the pool, how many leading blocks of the prompt it is believed to hold. */
  match(role: Role, hashes: readonly string[], nodes: readonly CandidateNode[]): Record<string, number> {
    return this.index[role].match(
      hashes,
      nodes.map((n) => n.id),
    );
  }

  /**
   * A request was routed as `decision` from `input`. Returns what the node that prefills it (P; D
   * when it serves alone or colocated) was believed to hold, for the lease to keep until that
   * engine answers; records who holds the prompt now: P computed it, D computed or received it.
   */
  routed(req: RouteRequest, decision: Decision, input: SelectionInput, cacheAware: CacheAwareParams): CachePrediction {
    const p = decision.prefill.id;
    const d = decision.decode.id;
    const disaggregated = decision.mode === "disaggregated";
    const node = disaggregated ? p : d;
    const role: Role = disaggregated ? "prefill" : "decode";
    const maxBlocks = cacheAware.maxBlocksPerRequest;
    const prediction = {
      node,
      role,
      hashes: req.prefixHashes.slice(0, maxBlocks),
      ...(req.prefixHashes.length > maxBlocks ? { endHash: req.prefixHashes.at(-1) as string } : {}),
      matched: input.prefixMatches[role][node] ?? 0,
      promptChars: req.promptChars ?? 0,
      blockChars: cacheAware.blockChars,
    };
    const dAlone = input.colocated || decision.prefill.rule === "local_prefill";
    if (!dAlone && p !== d) this.#record(req.prefixHashes, p, maxBlocks, input);
    this.#record(req.prefixHashes, d, maxBlocks, input);
    return prediction;
  }

  /**
   * The engine that prefilled the lease's request answered `usage`. Its prompt tokens teach the
   * node's characters per token; its cached tokens are counted against the prediction the lease
   * kept, and a run of answers that found nothing of well-predicted prefixes drops the node's
   * index entries, keeping this prompt, which it has just computed (only while `cluster` lists it).
   */
  learn(lease: Pick<NodeLease, "promptChars" | "prediction"> | undefined, usage: EngineUsage, cluster: ClusterView | null): void {
    if (!lease) return;
    const rate = this.rates.of(usage.node);
    if (lease.promptChars) this.rates.observe(usage.node, lease.promptChars, usage.promptTokens);
    const prediction = lease.prediction;
    if (!prediction || prediction.node !== usage.node) {
      this.feedback.count(usage);
      return;
    }
    if (!this.feedback.report(prediction, usage, rate).cacheLost || !cluster) return;
    this.forget(usage.node, "cache_lost");
    for (const role of ROLES) {
      if (cluster.nodes.some((n) => n.id === usage.node && (n.role === role || n.role === "both")))
        this.index[role].record(prediction.endHash ? [...prediction.hashes, prediction.endHash] : prediction.hashes, usage.node, prediction.hashes.length);
    }
  }

  /** Drops what the indexes believe the node holds: its cache is gone (lost, or it restarted). */
  forget(node: string, why: "cache_lost" | "probes_recovered"): void {
    this.index.prefill.forget(node);
    this.index.decode.forget(node);
    console.warn(JSON.stringify({ event: "prefix_cache_forgotten", node, reason: why }));
  }

  /** The node left the document: its entries, its rate and its feedback go. */
  forgetNode(node: string): void {
    this.index.prefill.forget(node);
    this.index.decode.forget(node);
    this.rates.forget(node);
    this.feedback.forget(node);
  }

  /** The node's feedback for /metrics and the status page. */
  status(node: string): NodeStatus["prefix"] {
    return { ...this.feedback.totals(node), charsPerToken: Math.round(this.rates.of(node) * 1000) / 1000 };
  }

  sizes(): { prefillEntries: number; decodeEntries: number; maxEntries: number } {
    return { prefillEntries: this.index.prefill.size, decodeEntries: this.index.decode.size, maxEntries: this.index.prefill.maxEntries };
  }

  /** Records that `node` holds the prompt's blocks, in the index of every pool it is a candidate of. */
  #record(hashes: readonly string[], node: string, maxBlocks: number, pools: Pick<SelectionInput, "prefill" | "decode">): void {
    for (const role of ROLES) {
      if (pools[role].some((n) => n.id === node)) this.index[role].record(hashes, node, maxBlocks);
    }
  }
}
