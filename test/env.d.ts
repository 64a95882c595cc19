export {};

declare module "vitest" {
  export interface ProvidedContext {
    /** where a Worker test file asks for its own simulated engines (test/global-setup.ts) */
    simFactory: string;
  }
}
