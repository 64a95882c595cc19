import { app } from "./app";
import type { Env } from "./env";

export { ClusterState } from "./state/cluster-state";

export default {
  fetch: (request, env, ctx) => app.fetch(request, env, ctx),
} satisfies ExportedHandler<Env>;
