// What a process group costs, from /proc: CPU time (utime + stime) and resident memory.
import { readdirSync, readFileSync } from 'node:fs';
import { execFileSync } from 'node:child_process';

let clockTicks = 0;
/** Clock ticks a second of /proc/<pid>/stat's utime and stime (USER_HZ, 100 on Linux). */
export function clockTicksPerSecond() {
  if (!clockTicks) {
    try {
      clockTicks = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;
    } catch {
      clockTicks = 100;
    }
  }
  return clockTicks;
}

/**
 * Parses one /proc/<pid>/stat line (the command may hold spaces and parentheses).
 * @param {string} line
 * @returns {{ comm: string, pgid: number, utime: number, stime: number }}
 */
export function parseProcStat(line) {
  const close = line.lastIndexOf(')');
  const comm = line.slice(line.indexOf('(') + 1, close);
  // fields after the command, counted from field 3 (state): pgrp is field 5, utime 14, stime 15
  const f = line.slice(close + 2).split(' ');
  return { comm, pgid: Number(f[2]), utime: Number(f[11]), stime: Number(f[12]) };
}

/**
 * Processes of a process group, by command name.
 * @param {number} pgid
 * @returns {{ pid: number, comm: string }[]}
 */
export function groupMembers(pgid) {
  const out = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const s = parseProcStat(readFileSync(`/proc/${entry}/stat`, 'utf8'));
      if (s.pgid === pgid) out.push({ pid: Number(entry), comm: s.comm });
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

/**
 * CPU milliseconds (user + system, all threads) used so far by each process named `comm` in the group.
 * @param {number} pgid @param {string} [comm] default workerd
 */
export function groupCpuMs(pgid, comm = 'workerd') {
  let ticks = 0;
  for (const m of groupMembers(pgid)) {
    if (m.comm !== comm) continue;
    try {
      const s = parseProcStat(readFileSync(`/proc/${m.pid}/stat`, 'utf8'));
      ticks += s.utime + s.stime;
    } catch {
      // gone
    }
  }
  return (ticks * 1000) / clockTicksPerSecond();
}

/** VmRSS in KB of the group's processes named `comm`, summed. @param {number} pgid @param {string} [comm] */
export function groupRssKb(pgid, comm = 'workerd') {
  let kb = 0;
  for (const m of groupMembers(pgid)) {
    if (m.comm !== comm) continue;
    try {
      const match = /VmRSS:\s+(\d+)\s+kB/.exec(readFileSync(`/proc/${m.pid}/status`, 'utf8'));
      if (match) kb += Number(match[1]);
    } catch {
      // gone
    }
  }
  return kb;
}

/**
 * Measures CPU over a phase: `const phase = cpuMeter(pgid); ...; phase.stop()` -> ms used.
 * @param {number} pgid @param {string} [comm]
 */
export function cpuMeter(pgid, comm = 'workerd') {
  const start = groupCpuMs(pgid, comm);
  return { stop: () => groupCpuMs(pgid, comm) - start };
}
