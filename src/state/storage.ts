import type { RoundRobinCursors } from "./cursors";
import type { ClusterView } from "./types";

// Everything the object keeps in its SQLite storage (the rest lives in memory and is rebuilt):
// - table `kv`, key `cursors`: the round-robin cursors as JSON, checkpointed by the alarm (cursors.ts says why not per request)
// - table `kv`, key `cluster`: the last cluster view synced, read back when a new instance starts
// - table `kv`, key `last_good_document`: the last valid cluster document's text (src/config/load.ts)
// A SignalPoller object (signal-poller.ts) keeps one key, `assignment` (its nodes, through the
// key-value API), and nothing else.
// Writes are `INSERT OR REPLACE`: on a primary-key conflict SQLite deletes the old row and inserts
// the new one (sqlite.org/lang_conflict.html), which for these two-column tables is an upsert.

// (A `cursor` table of earlier versions is no longer read: the rotation starts again at 0 once.)

export type StoredKey = "cursors" | "cluster" | "last_good_document";

/** Creates the tables and restores the cursors; returns the cluster view an earlier instance saved. */
export function openStorage(sql: SqlStorage, cursors: RoundRobinCursors): ClusterView | null {
  sql.exec(`CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL)`);
  const saved = readKey(sql, "cursors");
  if (saved !== null) cursors.restore(saved);
  const cluster = readKey(sql, "cluster");
  return cluster === null ? null : (JSON.parse(cluster) as ClusterView);
}

/** Writes the cursors when they moved since they were last saved (the alarm's checkpoint). */
export function saveCursors(sql: SqlStorage, cursors: RoundRobinCursors): void {
  const pair = cursors.unsaved();
  if (pair === null) return;
  writeKey(sql, "cursors", pair);
  cursors.saved(pair);
}

export function readKey(sql: SqlStorage, key: StoredKey): string | null {
  return sql.exec<{ value: string }>(`SELECT value FROM kv WHERE key = ?`, key).toArray()[0]?.value ?? null;
}

export function writeKey(sql: SqlStorage, key: StoredKey, value: string): void {
  sql.exec(`INSERT OR REPLACE INTO kv VALUES (?, ?)`, key, value);
}
