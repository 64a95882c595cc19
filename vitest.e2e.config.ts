import { defineConfig } from "vitest/config";

// End-to-end: the real Worker under `wrangler dev`, simulated engines, headless Chromium.
// Separate from `npm test` because it needs /usr/bin/chromium and starts whole processes.
export default defineConfig({
  test: {
    name: "e2e",
    environment: "node",
    include: ["test/e2e/**/*.test.{ts,mjs}"],
    testTimeout: 120000,
    hookTimeout: 120000,
    fileParallelism: false,
  },
});
