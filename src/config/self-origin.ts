import type { ClusterConfig } from "./schema";

/**
 * Ids of the nodes whose URL is `origin` (the router's own, e.g. `new URL(request.url).origin`):
 * sending to one of them would loop the request through the router. Pure; compares origins as
 * URL parses them (scheme, host and port, default ports dropped, host lower-cased).
 */
export function nodesPointingAt(config: Pick<ClusterConfig, "nodes">, origin: string): string[] {
  const self = originOf(origin);
  if (self === null) return [];
  return config.nodes.filter((n) => originOf(n.url) === self).map((n) => n.id);
}

function originOf(url: string): string | null {
  try {
    return new URL(url).origin;
  } catch {
    return null;
  }
}
