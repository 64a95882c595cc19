// Cloudflare lets one invocation have at most six connections waiting for response headers; a
// seventh fetch is queued by the runtime until one of them gets its headers — with its
// AbortSignal.timeout already running, so a long fan-out times out its own tail
// (developers.cloudflare.com/workers/platform/limits/#simultaneous-open-connections; since
// 2026-04-09 a slot frees when headers arrive, not when the body is read:
// developers.cloudflare.com/changelog/2026-04-09-relaxed-connection-limiting). Local workerd does
// not enforce it. Fan-outs (probes, /metrics polls, GET /v1/models) therefore queue here, and a
// request's timer is armed only when it is sent.

/** Connections one invocation may have waiting for response headers. */
export const CONNECTIONS_PER_INVOCATION = 6;

/**
 * At most `limit` sends in flight, the rest waiting in FIFO order. A slot is held until the send
 * settles (for a fetch: its headers arrived, or it failed), so a body is read outside it. One
 * instance per invocation: never shared between requests.
 */
export class ConnectionSlots {
  readonly #waiting: Array<() => void> = [];
  #busy = 0;

  constructor(readonly limit = CONNECTIONS_PER_INVOCATION) {}

  /** Runs `start` once a slot is free (it should arm its timeout itself, so the timer starts then). */
  send<T>(start: () => Promise<T>): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const run = () => {
        this.#busy++;
        let sent: Promise<T>;
        try {
          sent = start();
        } catch (err) {
          sent = Promise.reject(err);
        }
        sent.then(
          (value) => {
            this.#release();
            resolve(value);
          },
          (err) => {
            this.#release();
            reject(err);
          },
        );
      };
      if (this.#busy < this.limit) run();
      else this.#waiting.push(run);
    });
  }

  #release(): void {
    this.#busy--;
    this.#waiting.shift()?.();
  }
}
