import { app } from "./app";
import type { Env } from "./env";

export { ClusterState } from "./state/cluster-state";
export { SignalPoller } from "./state/signal-poller";

export default {
  fetch: (request, env, ctx) => app.fetch(request, env, ctx),
} satisfies ExportedHandler<Env>;
