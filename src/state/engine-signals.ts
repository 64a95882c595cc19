import type { SignalSettings } from "../config/cluster-view";
import { isBusy } from "../routing/kv-guard";
import type { NodeSignals as RoutingSignals } from "../routing/types";
import type { EngineReading } from "./engine-metrics";
import type { NodeSignalsStatus } from "./types";

/**
 * A node's signals as routing sees them: the last poll projected forward by what was sent since
 * (kvUsage 0..1 and queue, null when the engine reports none), how old the poll is, the engine's
 * KV capacity.
 */
export interface SignalView extends RoutingSignals {
  /** what the poll itself said */
  reported: EngineReading;
}

interface NodeReadings {
  reading: EngineReading;
  at: number;
  /** decode requests and their tokens routed to the node since the poll */
  sent: number;
  sentTokens: number;
  /** decode leases on the node released since the poll (requests taken before or after it) */
  freed: number;
  freedTokens: number;
  /** prefill legs the router had in flight on the node when the poll answered */
  prefillsAtPoll: number;
}

/**
 * The engines' own figures, polled from /metrics by the object's alarm, and the projection between
 * polls. Between two polls the router knows what it sent and what ended: KV use grows by the tokens
 * dispatched to the node and shrinks by those of leases released (vLLM counts a finished request's
 * blocks as free at once — vllm/v1/core/block_pool.py `get_usage` is 1 - free/total and freed blocks
 * join the free queue even while still cached — so a release frees its tokens right away). A
 * reading older than `staleMs` is ignored (routing falls back to leases), never waited for.
 */
export class EngineSignals {
  readonly #byNode = new Map<string, NodeReadings>();

  /**
   * A poll answered with these figures, while the router had `prefillsInFlight` prefill legs on the
   * node. `unseen`: decode requests routed to it that its engine has not got yet (under the await
   * protocol, those whose P has not answered): counted as sent after the poll, so their release
   * does not free KV the reading never held.
   */
  record(node: string, reading: EngineReading, now: number, prefillsInFlight = 0, unseen = { requests: 0, tokens: 0 }): void {
    const sent = Math.max(0, unseen.requests);
    this.#byNode.set(node, { reading, at: now, sent, sentTokens: Math.max(0, unseen.tokens), freed: 0, freedTokens: 0, prefillsAtPoll: Math.max(0, prefillsInFlight) });
  }

  /** A decode request (of about `tokens` prompt tokens) went to the node. */
  dispatched(node: string, tokens: number): void {
    const s = this.#byNode.get(node);
    if (!s) return;
    s.sent += 1;
    s.sentTokens += Math.max(0, tokens);
  }

  /** A decode lease on the node ended. */
  released(node: string, tokens: number): void {
    const s = this.#byNode.get(node);
    if (!s) return;
    s.freed += 1;
    s.freedTokens += Math.max(0, tokens);
  }

  /** A decode lease failed over from `from` (which never held its KV) to `to`. */
  moved(from: string | null, to: string, tokens: number): void {
    if (from) this.released(from, tokens);
    this.dispatched(to, tokens);
  }

  /**
   * The node's projected signals (what routing uses), or null when there is no poll younger than
   * `staleMs`. `prefillsNow`: the prefill legs the router has in flight on the node now (absent:
   * as at the poll). `leaseTokens`: the KV tokens the router's leases keep on it now (leases.ts
   * leaseKvTokens), a floor under the projected KV use (projectSignals).
   */
  view(node: string, now: number, staleMs: number, prefillsNow?: number, leaseTokens = 0): SignalView | null {
    const s = this.#byNode.get(node);
    if (!s || now - s.at > staleMs) return null;
    return {
      ...projectSignals(s, (prefillsNow ?? s.prefillsAtPoll) - s.prefillsAtPoll, leaseTokens),
      ageMs: Math.max(0, now - s.at),
      kvCapacityTokens: s.reading.kvCapacityTokens,
      reported: s.reading,
    };
  }

  /**
   * What the engine last said whatever its age, and its projection now (null when stale), for
   * /metrics and the status page; null until a poll answered. Only a decode node can be busy.
   */
  status(node: string, decodes: boolean, now: number, s: SignalSettings, leaseTokens = 0): NodeSignalsStatus | null {
    const last = this.#byNode.get(node);
    if (!last) return null;
    const view = this.view(node, now, s.staleMs, undefined, leaseTokens);
    const projected = view ? { kvUsage: view.kvUsage, queue: view.queue } : null;
    return {
      ...last.reading,
      at: last.at,
      ageMs: Math.max(0, now - last.at),
      projected,
      busy: decodes && view !== null && isBusy({ signals: view }, s),
    };
  }

  forget(node: string): void {
    this.#byNode.delete(node);
  }

  clear(): void {
    this.#byNode.clear();
  }
}

/**
 * KV: reported + (tokens sent - tokens freed) / capacity of all its engines, within 0..1 (without a capacity the
 * reading alone), and never below what the router's leases keep there (`leaseTokens` over the
 * same capacity: the prompts it decodes, and on a `both` node those it prefills as a P until P
 * answered, whose KV its engine holds for D). The floor is what the difference misses: a
 * request's end reaches the object after its engine has finished it, so a lease released after a
 * poll that no longer held its KV frees tokens the reading never counted. With agentic prompts one
 * such lease is a third of a node's KV: in a 16-session run a decode node that held nothing at the
 * poll was projected at 0.58 after a 45k-token release while the router's own leases there came
 * to 0.74, and was given a local prefill that took it to 0.95 (docs/routing.md). A floor can count
 * a finished request whose release is still on its way, or a shared prefix twice: it errs toward
 * busy, for a moment.
 *
 * Queue: an engine that had a queue at the poll admits a request only as another
 * ends, so its queue grows by each request sent and shrinks by each release; an engine with no
 * queue at the poll was admitting what it got, so it is taken to have none still. The prefill legs
 * the router sent the node move its queue the same way (`prefillDelta`: those in flight now less
 * those at the poll): on a `both` node most of the queue can be the prefills it was given as a P,
 * and without them a queue the poll caught stayed whole until the next poll after they had ended.
 */
export function projectSignals(
  s: Pick<NodeReadings, "reading" | "sent" | "sentTokens" | "freed" | "freedTokens">,
  prefillDelta = 0,
  leaseTokens = 0,
): { kvUsage: number | null; queue: number | null } {
  const { kvUsage, waiting, kvCapacityTokens, kvRanks = 1 } = s.reading;
  let kv = kvUsage;
  // kvUsage is the mean over the node's engines: what is sent spreads over all their capacity
  if (kv !== null && kvCapacityTokens !== null && kvCapacityTokens > 0) {
    const capacity = kvCapacityTokens * kvRanks;
    kv = Math.max(kv + (s.sentTokens - s.freedTokens) / capacity, Math.max(0, leaseTokens) / capacity);
  }
  const queue = waiting === null ? null : waiting > 0 ? Math.max(0, waiting + s.sent - s.freed + prefillDelta) : 0;
  return { kvUsage: kv === null ? null : Math.min(1, Math.max(0, kv)), queue };
}
