// The layers of src/ (docs/architecture.md), checked: a module may import its own layer and the
// layers below it, never one above, and no two modules may import each other through a circle.
// Type-only imports count: a type that two layers share lives in the lower one. The simulator
// (sim/, Node modules outside the Worker) has no layers, but no circles either: a JSDoc type
// import (`import('./x.mjs').T`) counts there too.
//
//   node scripts/check-imports.mjs          checks this repository's src/ and sim/ (part of `npm run lint`)
//   node scripts/check-imports.mjs DIR      checks DIR/src and DIR/sim, when there (the test plants violations in a copy)
//
// Exits 1 naming every import that runs up a layer and every circle; 0 otherwise.
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

/**
 * Top to bottom. A layer is a folder of src/ (or a top-level file); layers on one floor may not
 * import each other (auth and forward are siblings: neither needs the other).
 */
// biome-ignore format: one floor a line, top to bottom
export const FLOORS = [
  ['index.ts'],
  ['app.ts'],
  ['routes'],
  ['auth', 'forward'],
  ['state'],
  ['observability'],
  ['config'],
  ['routing'],
  ['errors.ts', 'env.ts'],
];

const floorOf = new Map(FLOORS.flatMap((layers, floor) => layers.map((layer) => [layer, floor])));

/** The layer of a path relative to src/: its first segment. */
export const layerOf = (rel) => rel.split('/')[0];

/** The relative module specifiers a TypeScript file imports or re-exports (`import type` included). */
export function importsOf(text) {
  const specifiers = [];
  const re = /(?:^|\n)\s*(?:import|export)\s[^;]*?\sfrom\s+["']([^"']+)["']|(?:^|\n)\s*import\s+["']([^"']+)["']|\bimport\(\s*["']([^"']+)["']\s*\)/g;
  for (const m of text.matchAll(re)) {
    const spec = m[1] ?? m[2] ?? m[3];
    if (spec.startsWith('.')) specifiers.push(spec);
  }
  return specifiers;
}

/** The files below `dir` (relative paths) whose names match `pattern`. */
function listFiles(dir, pattern, rel = '') {
  return readdirSync(path.join(dir, rel), { withFileTypes: true }).flatMap((e) => {
    const r = rel ? `${rel}/${e.name}` : e.name;
    if (e.isDirectory()) return listFiles(dir, pattern, r);
    return pattern.test(e.name) && !e.name.endsWith('.d.ts') ? [r] : [];
  });
}

/** The module a specifier names, relative to src/ (`./x` -> `x.ts`, a folder -> its index.ts). */
function resolve(files, fromRel, spec) {
  const base = path.posix.normalize(path.posix.join(path.posix.dirname(fromRel), spec));
  for (const candidate of [base, `${base}.ts`, `${base}/index.ts`, base.replace(/\.js$/, '.ts')]) {
    if (files.has(candidate)) return candidate;
  }
  return base.startsWith('..') ? null : base;
}

/** Checks `root`/src; returns the problems, one line each. */
export function checkImports(root) {
  const src = path.join(root, 'src');
  const files = new Set(listFiles(src, /\.ts$/));
  const graph = new Map();
  const problems = [];
  for (const file of [...files].sort()) {
    const from = layerOf(file);
    const deps = [];
    if (!floorOf.has(from)) problems.push(`src/${file}: its layer ${from} is not in scripts/check-imports.mjs FLOORS (docs/architecture.md)`);
    for (const spec of importsOf(readFileSync(path.join(src, file), 'utf8'))) {
      const target = resolve(files, file, spec);
      if (target === null) {
        problems.push(`src/${file}: imports ${spec}, outside src/`);
        continue;
      }
      deps.push(target);
      const to = layerOf(target);
      if (to === from) continue;
      const [ff, ft] = [floorOf.get(from), floorOf.get(to)];
      if (ff === undefined) continue;
      if (ft === undefined) problems.push(`src/${file}: imports src/${target}, whose layer ${to} is not in FLOORS`);
      else if (ft < ff) problems.push(`src/${file} (${from}) imports src/${target} (${to}): a layer above it`);
      else if (ft === ff) problems.push(`src/${file} (${from}) imports src/${target} (${to}): a sibling layer on the same floor`);
    }
    graph.set(file, deps);
  }
  problems.push(...circles(graph).map((c) => `circle: ${c.map((f) => `src/${f}`).join(' -> ')}`));
  return [...problems, ...checkSimCircles(root)];
}

/** The circles among the modules of `root`/sim (none when it has no sim/); one line each. */
export function checkSimCircles(root) {
  const sim = path.join(root, 'sim');
  if (!existsSync(sim)) return [];
  const files = new Set(listFiles(sim, /\.m?js$/));
  const graph = new Map();
  for (const file of [...files].sort()) {
    const deps = importsOf(readFileSync(path.join(sim, file), 'utf8')).map((spec) => path.posix.normalize(path.posix.join(path.posix.dirname(file), spec)));
    graph.set(
      file,
      deps.filter((d) => files.has(d)),
    );
  }
  return circles(graph).map((c) => `circle: ${c.map((f) => `sim/${f}`).join(' -> ')}`);
}

/** Every circle of the module graph, once each (Tarjan's strongly connected components, then a path through each). */
function circles(graph) {
  const index = new Map();
  const low = new Map();
  const stack = [];
  const onStack = new Set();
  const found = [];
  let next = 0;
  const visit = (v) => {
    index.set(v, next);
    low.set(v, next++);
    stack.push(v);
    onStack.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!graph.has(w)) continue;
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v), low.get(w)));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v), index.get(w)));
    }
    if (low.get(v) !== index.get(v)) return;
    const component = [];
    let w;
    do {
      w = stack.pop();
      onStack.delete(w);
      component.push(w);
    } while (w !== v);
    if (component.length > 1 || (graph.get(v) ?? []).includes(v)) found.push(pathThrough(graph, new Set(component), component.sort()[0]));
  };
  for (const v of graph.keys()) if (!index.has(v)) visit(v);
  return found;
}

/** A shortest path from `start` back to itself inside one component. */
function pathThrough(graph, component, start) {
  const prev = new Map([[start, null]]);
  const queue = [start];
  while (queue.length) {
    const v = queue.shift();
    for (const w of graph.get(v) ?? []) {
      if (w === start) {
        const route = [start];
        for (let u = v; u !== start; u = prev.get(u)) route.splice(1, 0, u);
        return [...route, start];
      }
      if (component.has(w) && !prev.has(w)) {
        prev.set(w, v);
        queue.push(w);
      }
    }
  }
  return [start, start];
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const root = path.resolve(process.argv[2] ?? path.join(path.dirname(fileURLToPath(import.meta.url)), '..'));
  const problems = checkImports(root);
  if (problems.length) {
    for (const p of problems) console.error(p);
    console.error(`\n${problems.length} import problem(s): see the layers of src/ and the rule for sim/ in docs/architecture.md (scripts/check-imports.mjs FLOORS).`);
    process.exit(1);
  }
  console.log(`imports: every module of src/ imports only its own layer and those below it, no circles (${FLOORS.map((f) => f.join('+')).join(' > ')}); no circles in sim/`);
}
