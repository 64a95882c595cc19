import { cloudflareTest } from "@cloudflare/vitest-pool-workers";
import { defineConfig } from "vitest/config";

// Two projects: the Worker suite runs inside workerd (the product), the Node suite
// covers the simulated engines and the benchmark, which are Node programs.
export default defineConfig({
  test: {
    projects: [
      {
        plugins: [
          cloudflareTest({
            main: "./src/index.ts",
            wrangler: { configPath: "./wrangler.toml" },
            miniflare: {
              bindings: { CONFIG_TTL_MS: "0" },
            },
          }),
        ],
        test: {
          name: "worker",
          include: ["test/worker/**/*.test.ts"],
          globalSetup: ["./test/global-setup.ts"],
          testTimeout: 20000,
          hookTimeout: 30000,
        },
      },
      {
        test: {
          name: "node",
          environment: "node",
          include: ["test/node/**/*.test.{ts,mjs}"],
          testTimeout: 30000,
        },
      },
    ],
  },
});
