import { spawnSync } from "node:child_process";
import path from "node:path";
import { describe, expect, it } from "vitest";
// @ts-expect-error plain JavaScript module without type declarations
import { BUDGET_GZIP_KIB, measureBundle, overBudget } from "../../scripts/bundle-size.mjs";

// The Worker's size is held to a budget: every isolate loads it on a cold start (docs/operations.md,
// "Bundle size"). `npm run size` (and .ci/run) print what it is made of; this keeps the gate
// itself honest and fails `npm test` too when the Worker outgrows the budget.

const ROOT = path.resolve(import.meta.dirname, "../..");

describe("the Worker's bundle size budget", () => {
  it("the Worker as wrangler would upload it is within the budget", async () => {
    const size = await measureBundle();
    // the script's own gzip of the modules agrees with wrangler's figure: the measurement is the upload
    expect(Math.abs(size.ownGzipKib - size.gzipKib)).toBeLessThan(0.02);
    expect(size.parts.map((p: { name: string }) => p.name)).toEqual(expect.arrayContaining(["hono", "valibot", "src/routes"]));
    // the schemas' former library and the status page's markup stay out of the Worker
    expect(size.parts.map((p: { name: string }) => p.name)).not.toContain("zod");
    expect(size.gzipKib, `the Worker is ${size.gzipKib} KiB gzip; budget ${BUDGET_GZIP_KIB} KiB`).toBeLessThanOrEqual(BUDGET_GZIP_KIB);
  }, 60_000);

  it("the check fails above the budget and names by how much", () => {
    expect(overBudget({ gzipKib: 50.01 }, 50)).toEqual({ over: true, byKib: 0.01 });
    expect(overBudget({ gzipKib: 50 }, 50)).toEqual({ over: false, byKib: 0 });
    expect(overBudget({ gzipKib: 47.75 }, 50).over).toBe(false);
  });

  it("`npm run size` exits 1 above the budget, saying by how much", () => {
    const script = path.join(ROOT, "scripts/bundle-size.mjs");
    const low = spawnSync(process.execPath, [script, "--budget-kib", "1"], { cwd: ROOT, encoding: "utf8" });
    expect(low.status).toBe(1);
    expect(low.stderr).toMatch(/The Worker is [\d.]+ KiB gzip over its budget of 1 KiB/);
    // it still prints the size and what the Worker is made of
    expect(low.stdout).toMatch(/Worker upload: [\d.]+ KiB \/ gzip [\d.]+ KiB \(budget 1 KiB gzip\)/);
    expect(low.stdout).toContain("valibot");
  }, 60_000);
});
