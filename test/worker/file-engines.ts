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

beforeAll(async () => {
  await resetRouter();
  await startFileEngines();
});
afterAll(async () => {
  try {
    await expectFileQuiet();
  } finally {
    await stopFileEngines();
  }
});
