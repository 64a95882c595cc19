// Cloudflare lets one invocation have six connections waiting for response headers; a seventh is
// queued until one of them has its headers, with its AbortSignal.timeout already running
// (developers.cloudflare.com/workers/platform/limits/#simultaneous-open-connections). Local
// workerd does not enforce it: this `fetch` does, for the fan-out tests and the sharded-polling
// measurement, every request answering its headers `headersMs` after it is sent.

export interface SixSlotFetch {
  fetch: (input: RequestInfo | URL, init?: RequestInit) => Promise<Response>;
  /** requests sent (given a slot), requests aborted by their signal (queued or sent), most in flight at once */
  stats: { sent: number; aborted: number; maxBusy: number };
  maxBusy: () => number;
}

/** `fetch` behind six FIFO slots, as Cloudflare runs it: a queued request's signal can fire while it waits. */
export function sixSlotFetch(answer: (url: URL) => Response, headersMs = 50): SixSlotFetch {
  const waiting: Array<() => void> = [];
  const stats = { sent: 0, aborted: 0, maxBusy: 0 };
  let busy = 0;
  const release = () => {
    busy--;
    waiting.shift()?.();
  };
  const fetch = (input: RequestInfo | URL, init?: RequestInit): Promise<Response> =>
    new Promise<Response>((resolve, reject) => {
      const signal = init?.signal ?? null;
      if (signal?.aborted) return reject(signal.reason);
      let state: "queued" | "sent" | "done" = "queued";
      let timer: ReturnType<typeof setTimeout> | undefined;
      const abort = () => {
        if (state === "queued") waiting.splice(waiting.indexOf(start), 1);
        if (state === "sent") {
          clearTimeout(timer);
          release();
        }
        state = "done";
        stats.aborted++;
        reject(signal?.reason);
      };
      const start = () => {
        state = "sent";
        busy++;
        stats.sent++;
        stats.maxBusy = Math.max(stats.maxBusy, busy);
        timer = setTimeout(() => {
          state = "done";
          signal?.removeEventListener("abort", abort);
          release();
          resolve(answer(new URL(input instanceof Request ? input.url : String(input))));
        }, headersMs);
      };
      signal?.addEventListener("abort", abort, { once: true });
      if (busy < 6) start();
      else waiting.push(start);
    });
  return { fetch, stats, maxBusy: () => stats.maxBusy };
}
