// V8 CPU profiles (the Chrome DevTools protocol's Profiler.stop result, a .cpuprofile file):
// self time by function, the "bottom-up" view of DevTools, as text.

/**
 * @typedef {{ functionName: string, url: string, lineNumber: number, columnNumber: number }} CallFrame
 * @typedef {{ id: number, callFrame: CallFrame, children?: number[] }} ProfileNode
 * @typedef {{ nodes: ProfileNode[], startTime: number, endTime: number, samples: number[], timeDeltas: number[] }} CpuProfile
 */

/**
 * Self time per function (same name, file and line summed over call paths), largest first.
 * (idle), (program) and (garbage collector) are kept: they say where the thread was not in JS.
 * @param {CpuProfile} profile
 * @param {number} [top]
 * @param {(url: string, line: number) => string} [sourceOf] names a frame's place (e.g. the source module of a bundle line)
 * @returns {{ totalMs: number, sampledMs: number, entries: { name: string, where: string, selfMs: number, selfShare: number, samples: number }[] }}
 */
export function topSelfTime(profile, top = 15, sourceOf = (/** @type {string} */ url, /** @type {number} */ line) => `${shortUrl(url)}:${line + 1}`) {
  /** @type {Map<number, ProfileNode>} */
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  /** @type {Map<number, ProfileNode>} */
  const parentOf = new Map();
  for (const n of profile.nodes) for (const c of n.children ?? []) parentOf.set(c, n);
  /** @type {Map<string, { name: string, where: string, selfUs: number, samples: number }>} */
  const acc = new Map();
  let sampledUs = 0;
  // timeDeltas[i] is the time before sample i; the time a sample stands for is the next delta
  for (let i = 0; i < profile.samples.length; i++) {
    const node = byId.get(profile.samples[i]);
    if (!node) continue;
    const us = profile.timeDeltas[i + 1] ?? 0;
    const f = node.callFrame;
    const name = f.functionName || '(anonymous)';
    // native frames (fetch, RPC stubs, stream internals) have no file: name their JS caller
    const caller = f.url ? undefined : nearestScriptCaller(node);
    const where = f.url
      ? sourceOf(f.url, f.lineNumber)
      : caller
        ? `from ${caller.callFrame.functionName || '(anonymous)'} in ${sourceOf(caller.callFrame.url, caller.callFrame.lineNumber)}`
        : '';
    const key = `${name}\u0000${where}`;
    const e = acc.get(key) ?? { name, where, selfUs: 0, samples: 0 };
    e.selfUs += us;
    e.samples += 1;
    acc.set(key, e);
    sampledUs += us;
  }
  /** @param {ProfileNode} node */
  function nearestScriptCaller(node) {
    for (let p = parentOf.get(node.id); p; p = parentOf.get(p.id)) if (p.callFrame.url) return p;
    return undefined;
  }
  const entries = [...acc.values()]
    .sort((a, b) => b.selfUs - a.selfUs)
    .slice(0, top)
    .map((e) => ({
      name: e.name,
      where: e.where,
      selfMs: Math.round(e.selfUs / 10) / 100,
      selfShare: sampledUs ? Math.round((e.selfUs / sampledUs) * 1000) / 1000 : 0,
      samples: e.samples,
    }));
  return { totalMs: Math.round((profile.endTime - profile.startTime) / 1000), sampledMs: Math.round(sampledUs / 1000), entries };
}

/** The bundle's path is long and the same for every entry: keep the file name. @param {string} url */
function shortUrl(url) {
  return url.replace(/^.*\//, '');
}

/**
 * The top entries as a fixed-width table.
 * @param {ReturnType<typeof topSelfTime>} top
 */
export function formatTop(top) {
  const lines = [`sampled ${top.sampledMs} ms of ${top.totalMs} ms`, `${'self ms'.padStart(9)}  ${'self %'.padStart(6)}  function (file:line)`];
  for (const e of top.entries) lines.push(`${e.selfMs.toFixed(1).padStart(9)}  ${(e.selfShare * 100).toFixed(1).padStart(6)}  ${e.name}${e.where ? ` (${e.where})` : ''}`);
  return lines.join('\n');
}

/**
 * Maps a line of an esbuild bundle to the module it came from: esbuild starts each module's
 * code with a `// path/to/module.ts` comment.
 * @param {string} bundle the bundle's text
 * @returns {(url: string, line: number) => string} zero-based line -> `module.ts (bundle line N)`
 */
export function bundleModules(bundle) {
  const lines = bundle.split('\n');
  /** @type {string[]} */
  const moduleAt = [];
  let current = '';
  for (let i = 0; i < lines.length; i++) {
    const m = /^\/\/ ((?:\.\.\/)*[\w@./-]+\.(?:ts|js|mjs|cjs))$/.exec(lines[i]);
    if (m) current = m[1].replace(/^(\.\.\/)+/, '').replace(/^.*node_modules\//, '');
    moduleAt.push(current);
  }
  return (url, line) => `${moduleAt[line] || shortUrl(url)} @${line + 1}`;
}
