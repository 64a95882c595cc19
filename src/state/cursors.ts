import type { Role } from "../routing/types";

/**
 * Round-robin cursors, one per role. They move in memory on every request; storage gets them
 * from the alarm (`unsaved`/`saved`): a write on the hot path would hold every routed response
 * behind the output gate until it is durable (~5 ms a request measured locally), and a rotation
 * restarting a few requests back after an eviction costs nothing.
 * Only `prefill` and `decode` are own enumerable fields: a copy (`{ ...cursors }`) is the pair.
 */
export class RoundRobinCursors {
  prefill = 0;
  decode = 0;
  readonly #saved = { prefill: 0, decode: 0 };

  /** Values read back from storage: in memory and known saved. */
  restore(role: Role, value: number): void {
    this[role] = value;
    this.#saved[role] = value;
  }

  set(next: { prefill: number; decode: number }): void {
    this.prefill = next.prefill;
    this.decode = next.decode;
  }

  /** The cursors that moved since they were last saved. */
  unsaved(): Array<{ role: Role; value: number }> {
    return (["prefill", "decode"] as const).filter((r) => this[r] !== this.#saved[r]).map((role) => ({ role, value: this[role] }));
  }

  saved(role: Role, value: number): void {
    this.#saved[role] = value;
  }
}
