// Set-up file of the Worker projects (vitest.config.ts setupFiles). The projects run without
// isolation: the files of one pool worker share a workerd, an isolate and its module cache, one
// file after the other. A setup file is evaluated again for every test file, so this one gives
// each file what a workerd of its own used to:
// - its module state reset (helpers.ts, signals-helpers.ts) before the file's own module runs;
// - a router as new (every Durable Object deleted, KV emptied, the isolate's caches forgotten);
// - simulated engines of its own for its whole run, so files running in parallel in other pool
//   workers never see each other's faults or traffic (test/global-setup.ts says why);
// - and, after its last test, a check that none of its requests still runs into the next file.
import { afterAll, beforeAll } from "vitest";
import { beginFile, expectFileQuiet, resetRouter, startFileEngines, stopFileEngines } from "./helpers";
import { beginSignalsFile } from "./signals-helpers";

beginFile();
beginSignalsFile();

// each step named in its error: a hook's failure shows only its message
const step = async (name: string, run: () => Promise<void>) => {
  try {
    await run();
  } catch (err) {
    throw new Error(`${name}: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
  }
};

beforeAll(async () => {
  await step("resetting the router for this file", resetRouter);
  await step("starting this file's engines", startFileEngines);
});
afterAll(async () => {
  try {
    await step("after this file's last test", expectFileQuiet);
  } finally {
    await step("stopping this file's engines", stopFileEngines);
  }
});
