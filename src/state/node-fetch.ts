import type { NodeReach } from "../config/schema";
import type { ConnectionSlots } from "../config/connection-slots";
import { nodeAccess, nodeGet } from "../config/node-access";
import { readEngineMetrics, type EngineReading } from "./engine-metrics";
import { probeSettings } from "./health";
import type { ClusterView } from "./types";

/** A node as the object reaches it (probes and /metrics polls). */
export interface ReachableNode {
  id: string;
  url: string;
  reach?: NodeReach | undefined;
  apiKeySecret?: string | undefined;
}

/**
 * The one place the object fetches a node (probes, /metrics polls): the way every leg reaches it
 * (its VPC binding, its Access service token: src/config/node-access.ts) and with its bearer
 * token — SGLang's --api-key middleware lets only /health*, /ready* and /metrics* through without
 * one (sgl-project/sglang python/sglang/srt/utils/auth.py `decide_request_auth`), and the sglang
 * protocol probes /v1/models (src/state/health.ts says why). Never follows a redirect; the
 * timeout covers the whole read and starts when the request is sent: given `slots`, it waits for
 * one of the invocation's six connections first (src/config/connection-slots.ts).
 */
export function fetchNode(env: Record<string, unknown>, node: ReachableNode, path: string, timeoutMs: number, slots?: ConnectionSlots): Promise<Response> {
  const access = nodeAccess(env, { ...node, reach: node.reach ?? {} });
  const send = () => nodeGet(access, node.url, path, AbortSignal.timeout(timeoutMs));
  return slots ? slots.send(send) : send();
}

/** GET the probe path: true on a 2xx within the timeout (a redirect is not a healthy node). */
export async function probeNode(env: Record<string, unknown>, node: ReachableNode, path: string, timeoutMs: number, slots?: ConnectionSlots): Promise<boolean> {
  try {
    const res = await fetchNode(env, node, path, timeoutMs, slots);
    await res.body?.cancel();
    return res.ok;
  } catch {
    return false;
  }
}

/**
 * Probes `nodes` (this sub-tick's slice) through the invocation's `slots`; `probed` hears each
 * answer as it comes (a slow node holds only its own probe and one slot).
 */
export async function probeNodes(
  env: Record<string, unknown>,
  cluster: ClusterView,
  nodes: readonly ReachableNode[],
  slots: ConnectionSlots,
  probed: (node: string, ok: boolean) => void,
): Promise<void> {
  const { path, timeoutMs } = probeSettings(cluster);
  await Promise.all(nodes.map(async (n) => probed(n.id, await probeNode(env, n, path, timeoutMs, slots))));
}

/** Polls the /metrics of `nodes` through `slots`, each read within `timeoutMs`; `polled` hears each answer as it comes. A failure is no reading (null): the last one goes stale. */
export async function pollNodes(
  env: Record<string, unknown>,
  timeoutMs: number,
  nodes: readonly ReachableNode[],
  slots: ConnectionSlots,
  polled: (node: string, reading: EngineReading | null) => void,
): Promise<void> {
  await Promise.all(nodes.map(async (n) => polled(n.id, await pollEngineMetrics(env, n, timeoutMs, METRICS_MAX_BYTES, slots))));
}

/** Bytes of a /metrics page read at most (a real vLLM or SGLang page is 20-150 KB). */
export const METRICS_MAX_BYTES = 512 * 1024;

/**
 * GET the node's /metrics and read the engine's figures: within `timeoutMs` (the whole read, not
 * only the headers) and at most `maxBytes` (reading stops there and what came is parsed). Any
 * failure — refused, slow, 401, HTML, garbage — is null: the caller keeps no new reading and the
 * old one goes stale.
 */
export async function pollEngineMetrics(
  env: Record<string, unknown>,
  node: ReachableNode,
  timeoutMs: number,
  maxBytes = METRICS_MAX_BYTES,
  slots?: ConnectionSlots,
): Promise<EngineReading | null> {
  try {
    // the slot is held until the headers arrive; the body is read outside it, within the same timeout
    const res = await fetchNode(env, node, "/metrics", timeoutMs, slots);
    if (!res.ok || !res.body) {
      await res.body?.cancel();
      return null;
    }
    return readEngineMetrics(await readBounded(res.body, maxBytes));
  } catch {
    return null;
  }
}

/** The body as text up to `maxBytes` (cut at the last whole line), then the rest is not read. */
async function readBounded(body: ReadableStream<Uint8Array>, maxBytes: number): Promise<string> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let text = "";
  let bytes = 0;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return text + decoder.decode();
      bytes += value.byteLength;
      if (bytes > maxBytes) {
        const keep = value.subarray(0, Math.max(0, value.byteLength - (bytes - maxBytes)));
        text += decoder.decode(keep);
        return text.slice(0, text.lastIndexOf("\n") + 1);
      }
      text += decoder.decode(value, { stream: true });
    }
  } finally {
    reader.cancel().catch(() => undefined);
  }
}
