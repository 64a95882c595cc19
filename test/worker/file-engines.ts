// Set-up file of the Worker projects (vitest.config.ts setupFiles): every test file gets its own
// simulated engines for its whole run, so files running in parallel never see each other's faults
// or traffic (test/global-setup.ts says why). The file's workerd (KV, Durable Objects) is its own too.
import { afterAll, beforeAll } from "vitest";
import { startFileEngines, stopFileEngines } from "./helpers";

beforeAll(startFileEngines);
afterAll(stopFileEngines);
