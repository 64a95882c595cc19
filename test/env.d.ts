export {};

declare module "vitest" {
  export interface ProvidedContext {
    /** the simulated engines of test/global-setup.ts */
    sim: { controlUrl: string; engines: Record<string, string> };
  }
}
