/** One sample of a node's figures, for the status page's charts. */
export interface NodeSample {
  node: string;
  inflight: number;
  /** the engine's reported KV use 0..1, null without a fresh poll */
  kvUsage: number | null;
  queue: number | null;
  /** requests routed to the node so far, both roles (rates come from the difference of two points) */
  requests?: number;
}

export interface HistoryPoint {
  t: number;
  nodes: NodeSample[];
  /** requests routed so far by this object */
  routed?: number;
}

/**
 * The last minutes of per-node figures, sampled by the object's alarm (each probe or poll), so
 * the status page shows them the moment it opens instead of starting flat. A ring of at most
 * `capacity` points spanning at most `keepMs`, a point every `everyMs` at most. The defaults: the
 * status page's charts, the last 15 minutes, a point a second at most.
 */
export class NodeHistory {
  readonly #points: HistoryPoint[] = [];
  #lastSample = 0;

  constructor(
    private readonly keepMs = 15 * 60_000,
    private readonly capacity = 1_000,
    private readonly everyMs = 1_000,
  ) {}

  /** Whether a point is due now; true counts it as taken. */
  due(now: number): boolean {
    if (now - this.#lastSample < this.everyMs) return false;
    this.#lastSample = now;
    return true;
  }

  add(point: HistoryPoint): void {
    this.#points.push(point);
    while (this.#points.length > this.capacity || (this.#points.length > 0 && this.#points[0]!.t < point.t - this.keepMs)) this.#points.shift();
  }

  points(now: number): HistoryPoint[] {
    return this.#points.filter((p) => p.t >= now - this.keepMs);
  }
}
