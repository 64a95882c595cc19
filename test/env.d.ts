export {};

declare module "vitest" {
  export interface ProvidedContext {
    /** where a Worker test file asks for its own simulated engines (test/global-setup.ts) */
    simFactory: string;
    /** where a signals test file asks for its own fronted engines (test/signals-global-setup.ts) */
    signalsFactory: string;
  }
}
