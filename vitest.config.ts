import { cloudflareTest } from "@cloudflare/vitest-pool-workers";
import { defineConfig } from "vitest/config";

/** The Worker under test with these bindings (the measurement project's). */
const routerWorker = (bindings: Record<string, string>) => cloudflareTest({ main: "./src/index.ts", wrangler: { configPath: "./wrangler.toml" }, miniflare: { bindings } });

/** test/worker-bench/sharded-polling.test.ts's settings, from the environment. */
const benchBindings = () => ({
  BENCH_SECONDS: process.env.PD_BENCH_SHARDED_S ?? "60",
  BENCH_SHARD_ABOVE: process.env.PD_BENCH_SHARD_ABOVE ?? "256",
  BENCH_HEADERS_MS: process.env.PD_BENCH_HEADERS_MS ?? "50",
});

// Two projects: the Worker suite runs inside workerd (the product), the Node suite
// covers the simulated engines and the benchmark, which are Node programs.
export default defineConfig({
  test: {
    // the router's one-line JSON logs are its product, not test output
    onConsoleLog: (log) => !log.includes('"event":"'),
    // Files run four at a time even on 2 cores: most of a file's time is waiting (workerd and
    // router processes starting, engines' simulated time), and every file has its own engines and
    // starts from a clean router (no shared state: docs/testing.md). Measured on the 2-core machine
    // with 142 files: three at a time 6m03s, four 4m58s.
    maxWorkers: 4,
    projects: [
      {
        plugins: [
          cloudflareTest({
            main: "./src/index.ts",
            wrangler: { configPath: "./wrangler.toml" },
            miniflare: {
              bindings: { CONFIG_TTL_MS: "0", NODE_TOKEN_P0: "node-secret-p0" },
            },
          }),
        ],
        test: {
          name: "worker",
          include: ["test/worker/**/*.test.ts"],
          // One workerd per pool worker, not per file: each file starts from a clean router instead
          // (test/worker/file-engines.ts; docs/testing.md), about half the CPU of a workerd per file.
          // A file that truly needs a workerd of its own (other bindings, a fresh isolate's
          // globals) would go in a project that keeps isolation; none does today.
          isolate: false,
          // the operations tests need the secrets set: they run in worker-secured; runtime-* in worker-runtime
          exclude: ["test/worker/ops-*.test.ts", "test/worker/runtime-*.test.ts"],
          globalSetup: ["./test/global-setup.ts", "./test/signals-global-setup.ts"],
          // each file its own engines and a clean router (the workerd is shared): files may run in parallel
          setupFiles: ["./test/worker/file-engines.ts"],
          testTimeout: 20000,
          hookTimeout: 30000,
        },
      },
      {
        // The same Worker with ADMIN_TOKEN, API_KEYS, METRICS_TOKEN and a rate limiter set.
        plugins: [
          cloudflareTest({
            main: "./src/index.ts",
            wrangler: { configPath: "./wrangler.toml" },
            miniflare: {
              bindings: {
                CONFIG_TTL_MS: "0",
                ADMIN_TOKEN: "ops-admin-token",
                // ops-key-flex carries a service tier (SPEC 9): it authenticates as "ops-key-flex"
                API_KEYS: " ops-key-main , ops-key-alt,, ops-key-limited , ops-key-flex:flex ",
                METRICS_TOKEN: "ops-metrics-token",
                RATE_LIMIT_PERIOD_S: "60",
              },
              ratelimits: { RATE_LIMITER: { simple: { limit: 40, period: 60 } } },
            },
          }),
        ],
        test: {
          name: "worker-secured",
          include: ["test/worker/ops-*.test.ts"],
          isolate: false,
          // after the other projects, so a second workerd does not compete with their timing-sensitive tests
          sequence: { groupOrder: 1 },
          // the signals rig too: fair share across API keys needs keys and busy decode nodes (ops-admission-*)
          globalSetup: ["./test/global-setup.ts", "./test/signals-global-setup.ts"],
          // each file its own engines and a clean router (the workerd is shared): files may run in parallel
          setupFiles: ["./test/worker/file-engines.ts"],
          testTimeout: 20000,
          hookTimeout: 30000,
        },
      },
      {
        // The Worker when the runtime around it fails: a rate limiter whose binding throws (an
        // outage of the limiting service) and short leases (a request workerd dropped stops renewing).
        plugins: [
          cloudflareTest({
            main: "./src/index.ts",
            wrangler: { configPath: "./wrangler.toml" },
            miniflare: {
              bindings: { CONFIG_TTL_MS: "0", API_KEYS: "runtime-key", LEASE_TTL_MS: "1000" },
              // RATE_LIMITER answers through RPC like the real binding (limit({ key })), and throws
              serviceBindings: { RATE_LIMITER: { name: "broken-rate-limiter" } },
              workers: [
                {
                  name: "broken-rate-limiter",
                  modules: true,
                  compatibilityDate: "2026-04-26",
                  script: [
                    'import { WorkerEntrypoint } from "cloudflare:workers";',
                    "const asked = [];",
                    "export default class BrokenRateLimiter extends WorkerEntrypoint {",
                    '  async limit({ key }) { asked.push(key); throw new Error("rate limiting service unavailable"); }',
                    "  async asked() { return asked.splice(0); }",
                    "}",
                  ].join("\n"),
                },
              ],
            },
          }),
        ],
        test: {
          name: "worker-runtime",
          include: ["test/worker/runtime-*.test.ts"],
          isolate: false,
          sequence: { groupOrder: 1 },
          globalSetup: ["./test/global-setup.ts"],
          setupFiles: ["./test/worker/file-engines.ts"],
          testTimeout: 20000,
          hookTimeout: 30000,
        },
      },
      // A measurement, not a test: only when asked (test/worker-bench/sharded-polling.test.ts says how)
      ...(process.env.PD_BENCH_SHARDED_S
        ? [
            {
              plugins: [routerWorker({ CONFIG_TTL_MS: "0", ...benchBindings() })],
              test: { name: "worker-bench", include: ["test/worker-bench/*.test.ts"], testTimeout: 3_600_000 },
            },
          ]
        : []),
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
