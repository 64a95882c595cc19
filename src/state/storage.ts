import type { RoundRobinCursors } from "./cursors";
import type { ClusterView } from "./types";

// Everything the object keeps in its SQLite storage (the rest lives in memory and is rebuilt):
// - table `cursor` (pool, value): the round-robin cursors, checkpointed by the alarm (cursors.ts says why not per request)
// - table `kv`, key `cluster`: the last cluster view synced, read back when a new instance starts
// - table `kv`, key `last_good_document`: the last valid cluster document's text (src/config/load.ts)
// Writes are `INSERT OR REPLACE`: on a primary-key conflict SQLite deletes the old row and inserts
// the new one (sqlite.org/lang_conflict.html), which for these two-column tables is an upsert.

export type StoredKey = "cluster" | "last_good_document";

/** Creates the tables and restores the cursors; returns the cluster view an earlier instance saved. */
export function openStorage(sql: SqlStorage, cursors: RoundRobinCursors): ClusterView | null {
  sql.exec(`CREATE TABLE IF NOT EXISTS cursor (pool TEXT PRIMARY KEY, value INTEGER NOT NULL)`);
  sql.exec(`CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL)`);
  for (const row of sql.exec<{ pool: string; value: number }>(`SELECT pool, value FROM cursor`)) {
    if (row.pool === "prefill" || row.pool === "decode") cursors.restore(row.pool, row.value);
  }
  const cluster = readKey(sql, "cluster");
  return cluster === null ? null : (JSON.parse(cluster) as ClusterView);
}

/** Writes the cursors that moved since they were last saved (the alarm's checkpoint). */
export function saveCursors(sql: SqlStorage, cursors: RoundRobinCursors): void {
  for (const { role, value } of cursors.unsaved()) {
    sql.exec(`INSERT OR REPLACE INTO cursor VALUES (?, ?)`, role, value);
    cursors.saved(role, value);
  }
}

export function readKey(sql: SqlStorage, key: StoredKey): string | null {
  return sql.exec<{ value: string }>(`SELECT value FROM kv WHERE key = ?`, key).toArray()[0]?.value ?? null;
}

export function writeKey(sql: SqlStorage, key: StoredKey, value: string): void {
  sql.exec(`INSERT OR REPLACE INTO kv VALUES (?, ?)`, key, value);
}
