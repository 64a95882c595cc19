import type { Env as RouterEnv } from "../src/env";

declare global {
  namespace Cloudflare {
    interface Env extends RouterEnv {}
  }
}

declare module "vitest" {
  export interface ProvidedContext {
    /** the simulated engines of test/global-setup.ts */
    sim: { controlUrl: string; engines: Record<string, string> };
  }
}
