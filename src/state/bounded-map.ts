/**
 * A Map that keeps at most `cap` entries: remembering a key makes it the newest, and the oldest
 * entry goes once the cap is passed (Map insertion order is the age order).
 */
export class BoundedMap<V> {
  readonly #entries = new Map<string, V>();

  constructor(private readonly cap: number) {}

  get size(): number {
    return this.#entries.size;
  }

  get(key: string): V | undefined {
    return this.#entries.get(key);
  }

  remember(key: string, value: V): void {
    this.#entries.delete(key);
    this.#entries.set(key, value);
    if (this.#entries.size > this.cap) this.#entries.delete(this.#entries.keys().next().value as string);
  }

  delete(key: string): boolean {
    return this.#entries.delete(key);
  }

  clear(): void {
    this.#entries.clear();
  }

  entries(): IterableIterator<[string, V]> {
    return this.#entries.entries();
  }
}
