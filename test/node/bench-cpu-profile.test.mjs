import { describe, expect, it } from 'vitest';
import { bundleModules, formatTop, topSelfTime } from '../../bench/lib/cpu-profile.mjs';

// root -> a (bundle line 3) -> b (line 6); one native frame without a url
const profile = {
  nodes: [
    { id: 1, callFrame: { functionName: '(root)', url: '', lineNumber: -1, columnNumber: -1 }, children: [2, 4] },
    { id: 2, callFrame: { functionName: 'a', url: 'file:///x/bundle/worker.mjs', lineNumber: 2, columnNumber: 0 }, children: [3] },
    { id: 3, callFrame: { functionName: 'b', url: 'file:///x/bundle/worker.mjs', lineNumber: 5, columnNumber: 0 } },
    { id: 4, callFrame: { functionName: '(idle)', url: '', lineNumber: -1, columnNumber: -1 } },
  ],
  startTime: 0,
  endTime: 10_000,
  samples: [2, 3, 3, 4, 3],
  timeDeltas: [0, 1000, 2000, 1000, 4000],
};

describe('CPU profile: self time by function', () => {
  it('charges each sample the time until the next one, largest first', () => {
    const top = topSelfTime(profile, 2);
    expect(top.entries).toEqual(
      [
        { name: 'b', where: 'worker.mjs:6', selfMs: 3, selfShare: 0.375, samples: 3 },
        { name: '(idle)', where: '', selfMs: 4, selfShare: 0.5, samples: 1 },
      ].sort((x, y) => y.selfMs - x.selfMs),
    );
    expect(top).toMatchObject({ totalMs: 10, sampledMs: 8 });
    expect(formatTop(top)).toContain('      4.0    50.0  (idle)');
    // a native frame under script code is named by its caller
    const native = {
      ...profile,
      nodes: [...profile.nodes.slice(0, 2), { ...profile.nodes[2], callFrame: { functionName: 'fetch', url: '', lineNumber: -1, columnNumber: -1 } }, profile.nodes[3]],
    };
    expect(topSelfTime(native, 3).entries.find((e) => e.name === 'fetch')).toMatchObject({ name: 'fetch', where: 'from a in worker.mjs:3' });
  });

  it("names the module of a bundle line from esbuild's module comments", () => {
    const bundle = ['// src/a.ts', 'function a() {', '  return 1;', '}', '// ../../node_modules/hono/dist/hono.js', 'function b() {}'].join('\n');
    const sourceOf = bundleModules(bundle);
    expect(sourceOf('file:///x/worker.mjs', 2)).toBe('src/a.ts @3');
    expect(sourceOf('file:///x/worker.mjs', 5)).toBe('hono/dist/hono.js @6');
    expect(topSelfTime(profile, 3, sourceOf).entries.find((e) => e.name === 'b')?.where).toBe('hono/dist/hono.js @6');
  });
});
