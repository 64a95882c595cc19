import type { EngineReading } from "./engine-metrics";
import type { ReachableNode } from "./node-fetch";

// Sharded polling (docs/scaling.md): past `signals.shardAbove` nodes the pool object hands its
// /metrics polls to poller objects (signal-poller.ts), each with its own alarm and six connections,
// and keeps only what they push. Pure: which poller polls which node, which pushed reading is new,
// which poller has gone silent.

/** What the pool object gives a poller: its nodes, for one document version. */
export interface PollerAssignment {
  /** the pool object's id (DurableObjectId.toString()): where readings go */
  pool: string;
  /** the poller's index among the pool's pollers */
  poller: number;
  version: string;
  nodes: ReachableNode[];
  intervalMs: number;
  /** a poll's whole read */
  timeoutMs: number;
}

/** One poll's outcome, compact: tens of bytes a node instead of its 20-150 KB page. `reading` null: the poll failed. */
export interface SignalReading {
  node: string;
  reading: EngineReading | null;
  /** when the poll answered (ms since the epoch, the poller's clock) */
  at: number;
  /** the poller's count of readings, breaking ties of `at` */
  seq: number;
}

/** A poller's readings of one sub-tick, for the document version it was assigned. */
export interface ReadingsPush {
  version: string;
  poller: number;
  readings: SignalReading[];
}

/** The pool object's answer: `stale_version`: it holds another document; the poller stops until assigned again. */
export type PushAnswer = "ok" | "stale_version";

/** The poller object's name for the pool object `pool` (its id) and index `i`. */
export const pollerName = (pool: string, i: number): string => `${pool}/poller:${i}`;

// which poller polls which node: the plan check counts a poller's run by the same split
export { assignPollers } from "../config/plan";

/**
 * Per node, the newest (at, seq) the pool object took: a reading not newer is dropped (a poller's
 * late push, or one replaced poller's last push arriving after its successor's).
 */
export class NewestReadings {
  readonly #newest = new Map<string, { at: number; seq: number }>();

  /** True (and remembered) when the reading is newer than any taken for its node. */
  take(r: Pick<SignalReading, "node" | "at" | "seq">): boolean {
    const held = this.#newest.get(r.node);
    if (held && (r.at < held.at || (r.at === held.at && r.seq <= held.seq))) return false;
    this.#newest.set(r.node, { at: r.at, seq: r.seq });
    return true;
  }

  forget(node: string): void {
    this.#newest.delete(node);
  }

  clear(): void {
    this.#newest.clear();
  }
}

/**
 * The pool object's view of its pollers: the version each was assigned and when each last pushed.
 * A poller that has not pushed for `silentIntervals` intervals is due a new assignment (a Durable
 * Object restarts on its next call; `assign` re-arms its alarm).
 */
export class PollerWatch {
  readonly #pollers = new Map<number, { version: string; heard: number }>();

  /** Pollers to (re-)assign now out of `count`: never assigned this version, or silent too long. */
  due(count: number, version: string, now: number, intervalMs: number, silentIntervals = 3): number[] {
    const due: number[] = [];
    for (let i = 0; i < count; i++) {
      const p = this.#pollers.get(i);
      if (!p || p.version !== version || now - p.heard > silentIntervals * intervalMs) due.push(i);
    }
    return due;
  }

  /** Assigned `version` now: it has `silentIntervals` intervals from now to push. */
  assigned(poller: number, version: string, now: number): void {
    this.#pollers.set(poller, { version, heard: now });
  }

  /** The poller pushed for the version in force (after the pool object restarted: known from now on). */
  heard(poller: number, version: string, now: number): void {
    this.#pollers.set(poller, { version, heard: now });
  }

  /** The indexes at or past `count` (the pool shrank, or stopped sharding): forgotten, returned to be stopped. */
  trim(count: number): number[] {
    const gone = [...this.#pollers.keys()].filter((i) => i >= count);
    for (const i of gone) this.#pollers.delete(i);
    return gone;
  }

  clear(): void {
    this.#pollers.clear();
  }

  /** Each poller's last push (or assignment), for the status. */
  lastHeard(): Array<{ poller: number; version: string; heard: number }> {
    return [...this.#pollers].map(([poller, p]) => ({ poller, ...p })).sort((a, b) => a.poller - b.poller);
  }
}
