/** One sample of a node's figures, for the status page's charts. */
export interface NodeSample {
  node: string;
  inflight: number;
  /** the engine's reported KV use 0..1, null without a fresh poll */
  kvUsage: number | null;
  queue: number | null;
}

export interface HistoryPoint {
  t: number;
  nodes: NodeSample[];
}

/**
 * The last minutes of per-node figures, sampled by the object's alarm (each probe or poll), so
 * the status page shows them the moment it opens instead of starting flat. A ring of at most
 * `capacity` points spanning at most `keepMs`.
 */
export class NodeHistory {
  readonly #points: HistoryPoint[] = [];

  constructor(
    private readonly keepMs: number,
    private readonly capacity: number,
  ) {}

  add(point: HistoryPoint): void {
    this.#points.push(point);
    while (this.#points.length > this.capacity || (this.#points.length > 0 && this.#points[0]!.t < point.t - this.keepMs)) this.#points.shift();
  }

  points(now: number): HistoryPoint[] {
    return this.#points.filter((p) => p.t >= now - this.keepMs);
  }
}
