/** The jobs the object's one alarm runs, each on its own period. */
export type AlarmJob = "probe" | "poll";

/**
 * Two schedules on one Durable Object alarm (an object has a single alarm): health probes every
 * `health.intervalMs` and /metrics polls every `signals.intervalMs`. The alarm is set for the
 * earliest job due; when it fires it runs the jobs due by then. An alarm that finds nothing due
 * was run early on purpose (`runDurableObjectAlarm` in tests, a retried alarm): it runs them all.
 */
export class AlarmSchedule {
  /** per job: when it is due next, and the period it was scheduled with */
  readonly #jobs = new Map<AlarmJob, { due: number; period: number }>();

  /**
   * Periods set (a new document). A job whose period shrank is due one new period from now
   * unless due sooner; one whose period grew is due one new period after its last run (its due
   * time minus the old period), not at the old time: either way the new period holds at once.
   */
  configure(periods: Record<AlarmJob, number>, now: number): void {
    for (const job of Object.keys(periods) as AlarmJob[]) {
      const period = periods[job];
      const j = this.#jobs.get(job);
      // an unchanged period keeps its due time (the last case with equal periods)
      const due = j === undefined ? now + period : period < j.period ? Math.min(j.due, now + period) : j.due - j.period + period;
      this.#jobs.set(job, { due, period });
    }
  }

  /** The jobs to run now, each rescheduled one period from now. */
  take(periods: Record<AlarmJob, number>, now: number): AlarmJob[] {
    const jobs = Object.keys(periods) as AlarmJob[];
    let due = jobs.filter((j) => (this.#jobs.get(j)?.due ?? 0) <= now);
    if (due.length === 0) due = jobs;
    for (const j of due) this.#jobs.set(j, { due: now + periods[j], period: periods[j] });
    return due;
  }

  /** When the alarm should fire next. */
  next(): number {
    return Math.min(...[...this.#jobs.values()].map((j) => j.due));
  }
}
