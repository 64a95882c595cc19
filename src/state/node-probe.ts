import { nodeAccess, nodeGet, type ReachableNode } from "../forward/node-fetch";
import type { ProbeSettings } from "./health";

/**
 * One active probe: a GET of the probe path, sent the way every request reaches the node (its
 * VPC binding, its Access service token) and with its bearer token — SGLang's --api-key
 * middleware lets only /health*, /ready* and /metrics* through without one
 * (sgl-project/sglang python/sglang/srt/utils/auth.py `decide_request_auth`), and the sglang
 * protocol probes /v1/models (src/state/health.ts says why). A redirect is not a healthy node
 * (and is never followed).
 */
export async function probeNode(env: Record<string, unknown>, node: ReachableNode & { url: string }, { path, timeoutMs }: ProbeSettings): Promise<boolean> {
  try {
    const res = await nodeGet(nodeAccess(env, node), node.url, path, AbortSignal.timeout(timeoutMs));
    await res.body?.cancel();
    return res.ok;
  } catch {
    return false;
  }
}
