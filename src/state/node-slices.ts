import type { AlarmJob } from "./alarm-schedule";

/**
 * Which nodes each alarm job visits this sub-tick: a job spread into k slices visits slice j of
 * the node list, nodes [floor(j*n/k), floor((j+1)*n/k)), then j+1, so every node once in k
 * sub-ticks (one period). A new node count or slice count keeps the rotation going.
 */
export class NodeSlices {
  readonly #next = new Map<AlarmJob, number>();

  take<T>(job: AlarmJob, nodes: readonly T[], slices: number): T[] {
    const k = Math.max(1, slices);
    const j = (this.#next.get(job) ?? 0) % k;
    this.#next.set(job, (j + 1) % k);
    const n = nodes.length;
    return nodes.slice(Math.floor((j * n) / k), Math.floor(((j + 1) * n) / k));
  }
}
