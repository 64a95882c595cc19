import { clusterState } from "../config/runtime";
import type { Decision, Role } from "../routing/types";
import type { Ctx } from "./app-env";
import { selectionFailure } from "./failures";
import { checkInferenceRequest, parseJsonObject, type RequestKind } from "./request-schema";
import type { RouteRequest } from "../state/types";
import { buildRouteRequest, type RouteCell } from "./route-request";

/** POST /v1/route: the decision this body would get, nothing forwarded, no lease taken. */
export async function explainRoute(c: Ctx, raw: string): Promise<Response> {
  // The body is the one the client would send: a completion when it has a prompt and no messages, else chat.
  const value = parseJsonObject(raw);
  const kind: RequestKind = !("messages" in value) && "prompt" in value ? "completion" : "chat";
  const body = checkInferenceRequest(value, kind);
  const { config, cells, request, keySource, prefixBlocks } = await buildRouteRequest(c, kind, body, raw.length, true);
  // its cells in order (one: the pool): the first that would not make it wait, else the first,
  // where it would wait (cell-states.ts)
  let first: Awaited<ReturnType<typeof explainIn>> | null = null;
  let found: Awaited<ReturnType<typeof explainIn>> | null = null;
  for (const cell of cells) {
    const answer = await explainIn(c, cell, request, cells.length > 1);
    const passed = !answer.routed.ok && answer.routed.error.kind === "decode_busy";
    if (!passed) first ??= answer;
    if (!passed && !(answer.routed.ok && answer.routed.wouldWait)) {
      found = answer;
      break;
    }
  }
  const { routed, snapshot, cell } = found ?? first ?? (await explainIn(c, cells[0]!, request, false));
  if (!routed.ok) throw selectionFailure(routed.error);
  const d: Decision = routed.decision;
  const summary = (role: Role) => ({ id: d[role].id, rule: d[role].rule, failOpen: d[role].failOpen, fallbacks: d[role].fallbacks });
  return c.json({
    protocol: config.protocol,
    policy: config.policy,
    // SPEC 8: how it would be served and why; the prompt's tokens on the chosen D and those D lacks
    mode: d.mode,
    reason: d.reason,
    promptTokens: d.tokens.prompt,
    uncachedTokens: d.tokens.uncachedOnDecode,
    // SPEC 9: predicted disaggregation's TTFT for the option taken (each candidate shows its own)
    ...(d.predictedTtftMs !== undefined ? { predictedTtftMs: d.predictedTtftMs } : {}),
    prefill: summary("prefill"),
    decode: summary("decode"),
    key: { source: keySource, hash: request.key, prefixBlocks },
    // docs/scaling.md: the cell (its object) that would route it, and the order the request tries them
    ...(cells.length > 1 ? { cell, cells: cells.map((x) => x.key) } : {}),
    rule: { prefill: d.prefill.rule, decode: d.decode.rule },
    candidates: { prefill: d.prefill.candidates, decode: d.decode.candidates },
    // every decode node that could serve it is busy: the request would wait at the edge (SPEC 8)
    admission: routed.wouldWait ? { wait: true, queued: routed.wouldWait.queued } : { wait: false },
    // health, breaker, failures, in-flight load and engine signals of every node, as the Durable Object sees them
    nodes: snapshot.nodes.map(({ id, healthy, probeUp, breaker, ejectedUntil, busyUntil, failureStreak, failuresTotal, inflight, drain, signals, rates }) => ({
      id,
      healthy,
      probeUp,
      breaker,
      ejectedUntil,
      busyUntil,
      failureStreak,
      failuresTotal,
      inflight,
      drain,
      signals,
      // learned rates (SPEC 9), whatever the disaggregation
      rates,
    })),
  });
}

/** One object's dry run and snapshot; both calls carry the view: they run concurrently, and the snapshot may be the object's first call. */
async function explainIn(c: Ctx, cell: RouteCell, request: RouteRequest, spill: boolean) {
  const state = clusterState(c.env, cell.key);
  const asked = { ...request, version: cell.view.version, cluster: cell.view, ...(spill ? { spill } : {}) };
  const [routed, snapshot] = await Promise.all([state.route(asked), state.snapshot(cell.view)]);
  return { routed, snapshot, cell: cell.key };
}
