import { env, runInDurableObject } from "cloudflare:test";
import { describe, expect, it } from "vitest";
import { RoundRobinCursors } from "../../../src/state/cursors";
import { openStorage, readKey, saveCursors, writeKey } from "../../../src/state/storage";
import { clusterView, viewNode } from "./fixtures";

// The object's SQLite storage, against the real thing: an object of its own, so the suite's one is untouched.

/** Runs `fn` with the storage of a ClusterState object nobody else uses (typed loosely: the stub's RPC types are too deep). */
async function withStorage<T>(name: string, fn: (sql: SqlStorage) => T): Promise<T> {
  const stub = env.CLUSTER_STATE.get(env.CLUSTER_STATE.idFromName(name)) as unknown;
  const run = runInDurableObject as unknown as (s: unknown, cb: (instance: unknown, state: DurableObjectState) => T) => Promise<T>;
  return run(stub, (_, state) => fn(state.storage.sql));
}

describe("the object's storage", () => {
  it("cursors: only those that moved are written, and a new instance reads them back", async () => {
    const [written, restored] = await withStorage("storage-cursors", (sql) => {
      const cursors = new RoundRobinCursors();
      openStorage(sql, cursors);
      cursors.set({ prefill: 3, decode: 0 });
      saveCursors(sql, cursors);
      const written = sql.exec<{ pool: string; value: number }>("SELECT pool, value FROM cursor ORDER BY pool").toArray();
      const again = new RoundRobinCursors();
      openStorage(sql, again);
      return [written, { ...again, unsaved: again.unsaved() }];
    });
    expect(written).toEqual([{ pool: "prefill", value: 3 }]);
    expect(restored).toEqual({ prefill: 3, decode: 0, unsaved: [] });
  });

  it("the cluster view and the last good document, each under its key", async () => {
    const view = clusterView([viewNode("d0", "decode")]);
    const [before, opened, lastGood] = await withStorage("storage-keys", (sql) => {
      const before = openStorage(sql, new RoundRobinCursors());
      writeKey(sql, "cluster", JSON.stringify(view));
      writeKey(sql, "last_good_document", "{}");
      writeKey(sql, "last_good_document", '{"nodes":[]}');
      return [before, openStorage(sql, new RoundRobinCursors()), readKey(sql, "last_good_document")];
    });
    expect(before).toBeNull();
    expect(opened).toEqual(view);
    expect(lastGood).toBe('{"nodes":[]}');
  });
});
