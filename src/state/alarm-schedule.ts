/** The jobs the object's one alarm runs, each on its own period. */
export type AlarmJob = "probe" | "poll";

/**
 * Two schedules on one Durable Object alarm (an object has a single alarm): health probes every
 * `health.intervalMs` and /metrics polls every `signals.intervalMs`. The alarm is set for the
 * earliest job due; when it fires it runs the jobs due by then. An alarm that finds nothing due
 * was run early on purpose (`runDurableObjectAlarm` in tests, a retried alarm): it runs them all.
 */
export class AlarmSchedule {
  readonly #due = new Map<AlarmJob, number>();

  /** Periods changed (a new document): each job is due one period from now unless due sooner. */
  configure(periods: Record<AlarmJob, number>, now: number): void {
    for (const job of Object.keys(periods) as AlarmJob[]) {
      const next = now + periods[job];
      const due = this.#due.get(job);
      if (due === undefined || due > next) this.#due.set(job, next);
    }
  }

  /** The jobs to run now, each rescheduled one period from now. */
  take(periods: Record<AlarmJob, number>, now: number): AlarmJob[] {
    const jobs = Object.keys(periods) as AlarmJob[];
    let due = jobs.filter((j) => (this.#due.get(j) ?? 0) <= now);
    if (due.length === 0) due = jobs;
    for (const j of due) this.#due.set(j, now + periods[j]);
    return due;
  }

  /** When the alarm should fire next. */
  next(): number {
    return Math.min(...this.#due.values());
  }
}
