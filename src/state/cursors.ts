/**
 * Round-robin cursors, one per role. They move in memory on every request; storage gets them
 * from the alarm (`unsaved`/`saved`): a write on the hot path would hold every routed response
 * behind the output gate until it is durable (~5 ms a request measured locally), and a rotation
 * restarting a few requests back after an eviction costs nothing.
 * Only `prefill` and `decode` are own enumerable fields: a copy (`{ ...cursors }`) or
 * `JSON.stringify(cursors)` is the pair.
 */
export class RoundRobinCursors {
  prefill = 0;
  decode = 0;
  /** the pair as JSON when it was last saved (or read back) */
  #saved = JSON.stringify(this);

  /** The pair read back from storage (as JSON): in memory and known saved. */
  restore(saved: string): void {
    this.set(JSON.parse(saved) as { prefill: number; decode: number });
    this.#saved = saved;
  }

  set(next: { prefill: number; decode: number }): void {
    this.prefill = next.prefill;
    this.decode = next.decode;
  }

  /** The pair as JSON when it moved since it was last saved; null when it did not. */
  unsaved(): string | null {
    const now = JSON.stringify(this);
    return now === this.#saved ? null : now;
  }

  saved(pair: string): void {
    this.#saved = pair;
  }
}
