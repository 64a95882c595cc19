import { SILENT_AFTER_POLLS } from "../observability/node-warnings";

/**
 * Nodes that answer their probes but whose /metrics never gave a reading: SGLang serves /metrics
 * only with --enable-metrics, off by default (python/sglang/srt/server_args.py `enable_metrics`;
 * http_server.py mounts the route only then), so the KV guard and the admission queue see nothing
 * of it. Named on the status page and, once a node, in the log. A reading clears it.
 */
export class SilentNodes {
  /** per node: polls without a reading while its probes were up; -1 once it gave a reading */
  readonly #polls = new Map<string, number>();
  readonly #logged = new Set<string>();

  /** One poll of the node; true when this poll makes it silent for the first time (log it). */
  polled(node: string, gotReading: boolean, probeUp: boolean): boolean {
    if (gotReading) {
      this.#polls.set(node, -1);
      return false;
    }
    const n = this.#polls.get(node) ?? 0;
    if (n < 0 || !probeUp) return false;
    this.#polls.set(node, n + 1);
    if (n + 1 < SILENT_AFTER_POLLS || this.#logged.has(node)) return false;
    this.#logged.add(node);
    return true;
  }

  silent(node: string): boolean {
    return (this.#polls.get(node) ?? 0) >= SILENT_AFTER_POLLS;
  }

  forget(node: string): void {
    this.#polls.delete(node);
    this.#logged.delete(node);
  }

  clear(): void {
    this.#polls.clear();
    this.#logged.clear();
  }
}
