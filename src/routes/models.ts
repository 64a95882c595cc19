import type { ClusterConfig } from "../config/schema";

/**
 * Union of the models the cluster serves: the `models` lists of the document, plus what
 * nodes without such a list report on their own /v1/models (they serve everything they load).
 */
export async function listModels(config: ClusterConfig, timeoutMs = 2_000): Promise<string[]> {
  const names = new Set<string>();
  const ask: string[] = [];
  for (const n of config.nodes) {
    if (n.models) n.models.forEach((m) => names.add(m));
    else ask.push(n.url);
  }
  await Promise.all(
    [...new Set(ask)].map(async (origin) => {
      try {
        const res = await fetch(new URL("/v1/models", origin), { signal: AbortSignal.timeout(timeoutMs) });
        if (!res.ok) return void (await res.body?.cancel());
        const body = (await res.json()) as { data?: Array<{ id?: unknown }> };
        for (const m of body.data ?? []) if (typeof m.id === "string") names.add(m.id);
      } catch {
        // an unreachable node lists nothing; its health is reported elsewhere
      }
    }),
  );
  return [...names].sort();
}
