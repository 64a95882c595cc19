export {};

declare module "vitest" {
  export interface ProvidedContext {
    /** the simulated engines of test/global-setup.ts */
    sim: { controlUrl: string; engines: Record<string, string> };
    /** nodes with a steerable GET /metrics in front of simulated engines (test/signals-global-setup.ts) */
    signals: { controlUrl: string; simControlUrl: string; nodes: Record<string, string> };
  }
}
