import { parseClusterDocument, type ClusterConfig, type ConfigDefaults, type Problem } from "./schema";

export const CONFIG_KEY = "nodes";
export const DEFAULT_CONFIG_TTL_MS = 5_000;

/** What the isolate currently serves: the last valid document, and what is wrong with the stored one. */
export interface ConfigSnapshot {
  /** the document being served (the stored one when valid, else the last valid one), null when none */
  config: ClusterConfig | null;
  /** version of the served document (stable across isolates for the same text) */
  version: string;
  /** problems of the stored document; empty when it is valid */
  problems: Problem[];
  /** true when the stored document is invalid or missing and an older one is served */
  stale: boolean;
}

export interface ConfigSource {
  read(): Promise<string | null>;
  /** remembers the last valid text outside the isolate, so a new isolate can serve it too */
  saveLastGood?(raw: string): Promise<void>;
  loadLastGood?(): Promise<string | null>;
  defaults: ConfigDefaults;
  ttlMs: number;
  now(): number;
  log?(event: Record<string, unknown>): void;
}

/** Cheap stable text fingerprint (FNV-1a, 32-bit) — only used to notice a changed document. */
export function textVersion(text: string): string {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return (h >>> 0).toString(16).padStart(8, "0") + text.length.toString(16);
}

/**
 * Loads the cluster document with an isolate-level cache. An invalid or missing document
 * never replaces a valid one; it is reported (problems) while the last valid one serves.
 */
export class ClusterConfigLoader {
  #lastGood: { raw: string; config: ClusterConfig; version: string } | null = null;
  #snapshot: ConfigSnapshot | null = null;
  #loadedAt = -Infinity;
  #lastRaw: string | null | undefined = undefined;
  /** reads started / the newest read applied: a slow read never overwrites a newer one */
  #readsStarted = 0;
  #readApplied = 0;

  /**
   * The cached snapshot, or a fresh one read by THIS call. Deliberately no shared in-flight
   * refresh: workerd ties I/O to the request that started it and cancels ("hung") another
   * request awaiting it, so concurrent requests that find the cache stale each do their own KV
   * read (KV serves repeated reads from its edge cache). Only data is shared between requests.
   */
  async get(source: ConfigSource): Promise<ConfigSnapshot> {
    if (this.#snapshot && source.now() - this.#loadedAt < source.ttlMs) return this.#snapshot;
    return this.#refresh(source);
  }

  /** Drops the isolate cache (tests, and the admin API after a write). */
  invalidate(): void {
    this.#loadedAt = -Infinity;
  }

  /**
   * Forgets everything, the last valid document too, as a new isolate starts. Test seam only: the
   * Worker tests share one isolate across test files (vitest.config.ts), and each file starts with
   * what a fresh isolate has (test/worker/file-engines.ts).
   */
  forget(): void {
    this.#lastGood = null;
    this.#snapshot = null;
    this.#loadedAt = -Infinity;
    this.#lastRaw = undefined;
  }

  async #refresh(source: ConfigSource): Promise<ConfigSnapshot> {
    const read = ++this.#readsStarted;
    let raw: string | null;
    try {
      raw = await source.read();
    } catch (err) {
      // KV unreachable: keep serving what we have rather than failing every request.
      if (this.#snapshot) return this.#snapshot;
      raw = null;
      source.log?.({ event: "config_read_failed", error: String(err) });
    }
    // A read that started before one already applied saw an older (or the same) document.
    if (this.#snapshot && read < this.#readApplied) return this.#snapshot;
    if (this.#snapshot && raw === this.#lastRaw) {
      this.#readApplied = read;
      this.#loadedAt = source.now();
      return this.#snapshot;
    }

    const problems: Problem[] = [];
    let good = this.#lastGood;
    if (raw === null) {
      problems.push({ path: "(document)", message: `no cluster document in KV binding NODES at key "${CONFIG_KEY}"` });
    } else {
      const parsed = parseClusterDocument(raw, source.defaults);
      if (parsed.ok) good = good?.raw === raw ? good : { raw, config: parsed.config, version: textVersion(raw) };
      else problems.push(...parsed.problems);
    }
    if (problems.length > 0) {
      source.log?.({ event: "config_invalid", problems });
      if (!good && source.loadLastGood) {
        const saved = await source.loadLastGood().catch(() => null);
        const parsed = saved ? parseClusterDocument(saved, source.defaults) : null;
        if (saved && parsed?.ok) good = { raw: saved, config: parsed.config, version: textVersion(saved) };
        if (this.#snapshot && read < this.#readApplied) return this.#snapshot; // a newer read applied meanwhile
      }
    }
    // Everything this read found is applied at once, with no await in between: a concurrent
    // request never sees `lastRaw` updated while the snapshot still describes the old text.
    const fresh = good !== null && good !== this.#lastGood && good.raw === raw;
    this.#readApplied = read;
    this.#loadedAt = source.now();
    this.#lastRaw = raw;
    this.#lastGood = good;
    this.#snapshot = {
      config: good?.config ?? null,
      version: good?.version ?? "none",
      problems,
      stale: problems.length > 0 && good !== null,
    };
    const snapshot = this.#snapshot;
    if (fresh && raw !== null) await source.saveLastGood?.(raw).catch(() => undefined);
    return snapshot;
  }
}
