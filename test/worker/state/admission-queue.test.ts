import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { AdmissionQueue } from "../../../src/state/admission-queue";
import { AlarmSchedule } from "../../../src/state/alarm-schedule";

const S = { queueMs: 1000, maxQueued: 3 };

describe("the admission queue", () => {
  it("is bounded, first come first served, and lets a waiter leave", () => {
    const q = new AdmissionQueue<string>();
    expect(q.enqueue("a", "A", 0, S)).not.toBeNull();
    expect(q.enqueue("b", "B", 1, S)).not.toBeNull();
    expect(q.enqueue("c", "C", 2, S)).not.toBeNull();
    expect(q.enqueue("d", "D", 3, S)).toBeNull();
    expect(q.leave("b")?.item).toBe("B");
    expect(q.leave("b")).toBeNull();
    const order: string[] = [];
    q.admit((w) => (order.push(w.item), true));
    expect(order).toEqual(["A", "C"]);
    expect(q.size).toBe(0);
  });

  it("expires waiters at their deadline and names the next one", () => {
    const q = new AdmissionQueue<string>();
    q.enqueue("a", "A", 0, S);
    q.enqueue("b", "B", 500, S);
    expect(q.nextDeadline()).toBe(1000);
    expect(q.expire(999)).toHaveLength(0);
    expect(q.expire(1000).map((w) => w.item)).toEqual(["A"]);
    expect(q.nextDeadline()).toBe(1500);
  });

  it("admits in arrival order among waiters that compete for the same capacity (property)", () => {
    fc.assert(
      fc.property(fc.array(fc.constantFrom("m1", "m2"), { maxLength: 30 }), fc.nat(10), fc.nat(10), (models, room1, room2) => {
        const q = new AdmissionQueue<string>();
        models.forEach((m, i) => q.enqueue(String(i), m, i, { queueMs: 1e9, maxQueued: 1000 }));
        const room: Record<string, number> = { m1: room1, m2: room2 };
        const admitted: number[] = [];
        q.admit((w) => {
          if (room[w.item]! <= 0) return false;
          room[w.item]!--;
          admitted.push(Number(w.ticket));
          return true;
        });
        for (const m of ["m1", "m2"]) {
          const mine = models
            .map((x, i) => [x, i] as const)
            .filter(([x]) => x === m)
            .map(([, i]) => i);
          const got = admitted.filter((i) => models[i] === m);
          expect(got).toEqual(mine.slice(0, got.length));
        }
      }),
    );
  });
});

describe("two schedules on one alarm", () => {
  const periods = { probe: 10_000, poll: 5_000 };
  it("fires for the earliest job and runs what is due", () => {
    const s = new AlarmSchedule();
    s.configure(periods, 0);
    expect(s.next()).toBe(5_000);
    expect(s.take(periods, 5_000)).toEqual(["poll"]);
    expect(s.next()).toBe(10_000);
    expect(s.take(periods, 10_000).sort()).toEqual(["poll", "probe"]);
  });

  it("an alarm run early (nothing due) runs every job", () => {
    const s = new AlarmSchedule();
    s.configure(periods, 0);
    expect(s.take(periods, 1).sort()).toEqual(["poll", "probe"]);
  });

  it("a new document with a shorter period brings the job forward", () => {
    const s = new AlarmSchedule();
    s.configure(periods, 0);
    s.configure({ probe: 10_000, poll: 1_000 }, 100);
    expect(s.next()).toBe(1_100);
  });
});
