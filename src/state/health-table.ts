import { freshHealth, type NodeHealth } from "./health";

/** Each node's health record (transitions in health.ts), kept in step with the document's nodes. */
export class NodeHealthTable {
  readonly #byNode = new Map<string, NodeHealth>();

  get(node: string): NodeHealth | undefined {
    return this.#byNode.get(node);
  }

  /** The node's record, or a fresh one for a node not seen yet (not stored). */
  view(node: string): NodeHealth {
    return this.#byNode.get(node) ?? freshHealth();
  }

  /** Adds records for new nodes and drops those of nodes no longer listed; returns the dropped ids. */
  sync(ids: ReadonlySet<string>): string[] {
    for (const id of ids) if (!this.#byNode.has(id)) this.#byNode.set(id, freshHealth());
    const gone = [...this.#byNode.keys()].filter((id) => !ids.has(id));
    for (const id of gone) this.#byNode.delete(id);
    return gone;
  }

  clear(): void {
    this.#byNode.clear();
  }
}
