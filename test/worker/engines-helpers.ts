// Helpers for the engines-*.test.ts files: what the strict simulator reports (sim/engine.mjs).
import { control, received } from "./helpers";
// @ts-expect-error plain JS module of the simulator
import { expectedPrefix as simExpectedPrefix } from "../../sim/engine.mjs";

/** What a correct answer to this body (prompt `index` of a batch) starts with: the prompt's digest. */
export const expectedPrefix = (body: unknown, index = 0): string => simExpectedPrefix(body, index);

export type EngineStats = Record<string, any> & {
  heldHandles: number;
  heldBlocks: number;
  issuedHandles: number;
  consumedHandles: number;
  releasedHandles: number;
  expiredHandles: number;
  staleHandleReads: number;
  foreignHandleReads: number;
  duplicateRequestIds: number;
  sglangAborts: number;
  clientAborts: number;
  inflight: number;
};

export const stats = (id: string): Promise<EngineStats> => control(`/engines/${id}/stats`);
export const allStats = (): Promise<Record<string, EngineStats>> => control("/stats");
export const setOptions = (id: string, o: Record<string, number | boolean>) => control(`/engines/${id}/options`, o);
export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Polls `read` until `ok` holds (or throws with the last value after `timeoutMs`). */
export async function waitFor<T>(read: () => Promise<T>, ok: (v: T) => boolean, timeoutMs = 3000, what = "condition"): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last = await read();
  while (!ok(last)) {
    if (Date.now() > deadline) throw new Error(`${what} not reached within ${timeoutMs} ms: ${JSON.stringify(last)}`);
    await sleep(25);
    last = await read();
  }
  return last;
}

/**
 * Waits until no engine has a request open. A test whose fault slows every request to a node
 * also slows the handle release the router sends there afterwards; waiting here keeps that
 * request from running into the next test.
 */
export const enginesIdle = (timeoutMs = 5000) => waitFor(allStats, (all) => Object.values(all).every((e) => e.inflight === 0), timeoutMs, "engines idle");

/** The kv_transfer_params of every completion request an engine received (release requests included). */
export async function kvParamsReceived(id: string): Promise<Array<{ model: string; kv: any; requestId: string; receivedAt: number }>> {
  return (await received(id))
    .filter((r) => r.path.startsWith("/v1/"))
    .map((r) => {
      const body = JSON.parse(r.body);
      return { model: body.model, kv: body.kv_transfer_params, requestId: r.headers["x-request-id"] ?? "", receivedAt: (r as any).receivedAt };
    });
}

/** The answer's text: a chat message's content or a completion's text (choice `index`). */
export function answerText(json: any, index = 0): string {
  const choice = json.choices.find((c: any) => c.index === index);
  return choice.message?.content ?? choice.text;
}

/** The `data:` events of an SSE body, parsed ([DONE] as the string). */
export function sseEvents(text: string): any[] {
  return text
    .split("\n")
    .filter((l) => l.startsWith("data:"))
    .map((l) => l.slice(5).trim())
    .map((d) => (d === "[DONE]" ? d : JSON.parse(d)));
}

/** The streamed text of choice `index`, in order. */
export function streamedText(events: any[], index = 0): string {
  return events
    .filter((e) => e !== "[DONE]" && Array.isArray(e.choices))
    .flatMap((e) => e.choices.filter((c: any) => c.index === index))
    .map((c: any) => c.delta?.content ?? c.text ?? "")
    .join("");
}

/** A prompt of about `tokens` tokens (4 characters each), unique by `tag`. */
export const longPrompt = (tag: string, tokens: number) => `${tag} `.padEnd(tokens * 4, "lorem ipsum dolor sit amet ");

/** Node failures the router counted (Durable Object snapshot), by node id. */
export async function failuresByNode(snapshot: () => Promise<{ nodes: Array<{ id: string; failuresTotal: number }> }>): Promise<Record<string, number>> {
  return Object.fromEntries((await snapshot()).nodes.map((n) => [n.id, n.failuresTotal]));
}
