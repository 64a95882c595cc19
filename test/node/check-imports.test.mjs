// The import-boundary check of `npm run lint` (scripts/check-imports.mjs, docs/architecture.md):
// this tree passes it, and a copy of src/ (or sim/) with one planted violation fails it, naming the import.
import { spawnSync } from 'node:child_process';
import { appendFileSync, cpSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';
import { checkImports, importsOf } from '../../scripts/check-imports.mjs';

const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const SCRIPT = path.join(REPO_ROOT, 'scripts/check-imports.mjs');

let dirs = [];
afterEach(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
  dirs = [];
});

/** A copy of this repository's src/ (or `folder`), with `plant` applied to it. */
function plantedTree(plant, folder = 'src') {
  const root = mkdtempSync(path.join(os.tmpdir(), 'check-imports-'));
  dirs.push(root);
  cpSync(path.join(REPO_ROOT, 'src'), path.join(root, 'src'), { recursive: true });
  if (folder !== 'src') cpSync(path.join(REPO_ROOT, folder), path.join(root, folder), { recursive: true });
  plant(path.join(root, folder));
  return root;
}

const run = (root) => spawnSync(process.execPath, [SCRIPT, root], { encoding: 'utf8' });

describe('the layers of src/', () => {
  it('this tree imports only down its layers, with no circle', () => {
    expect(checkImports(REPO_ROOT)).toEqual([]);
    const r = run(REPO_ROOT);
    expect(r.status).toBe(0);
  });

  it('fails on a lower layer importing a higher one, naming the file and the import', () => {
    const root = plantedTree((src) => appendFileSync(path.join(src, 'state/leases.ts'), '\nimport { retryAfterMs } from "../forward/upstream";\nvoid retryAfterMs;\n'));
    expect(checkImports(root)).toEqual(['src/state/leases.ts (state) imports src/forward/upstream.ts (forward): a layer above it']);
    const r = run(root);
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('src/state/leases.ts (state) imports src/forward/upstream.ts (forward)');
  });

  it('counts a type-only import: a type two layers share lives in the lower one', () => {
    const root = plantedTree((src) =>
      appendFileSync(path.join(src, 'config/self-origin.ts'), '\nimport type {\n  ClusterSnapshot,\n} from "../state/types";\nexport type Planted = ClusterSnapshot;\n'),
    );
    expect(checkImports(root)).toEqual(['src/config/self-origin.ts (config) imports src/state/types.ts (state): a layer above it']);
  });

  it('fails on siblings of one floor importing each other (auth and forward)', () => {
    const root = plantedTree((src) => appendFileSync(path.join(src, 'auth/bearer.ts'), '\nexport { HOP_HEADER } from "../forward/upstream";\n'));
    expect(checkImports(root)).toEqual(['src/auth/bearer.ts (auth) imports src/forward/upstream.ts (forward): a sibling layer on the same floor']);
  });

  it('fails on a circle inside one layer, and on a folder the layers do not name', () => {
    const root = plantedTree((src) => {
      writeFileSync(path.join(src, 'state/planted-a.ts'), 'import { b } from "./planted-b";\nexport const a = () => b;\n');
      writeFileSync(path.join(src, 'state/planted-b.ts'), 'import { a } from "./planted-a";\nexport const b = () => a;\n');
      cpSync(path.join(src, 'errors.ts'), path.join(src, 'extra/errors.ts'));
    });
    expect(checkImports(root)).toEqual([
      'src/extra/errors.ts: its layer extra is not in scripts/check-imports.mjs FLOORS (docs/architecture.md)',
      'circle: src/state/planted-a.ts -> src/state/planted-b.ts -> src/state/planted-a.ts',
    ]);
  });
});

describe('the modules of sim/', () => {
  it('fails on sim/endpoints.mjs importing the engine entry that imports it (the circle issue 26 removed)', () => {
    const root = plantedTree((sim) => appendFileSync(path.join(sim, 'endpoints.mjs'), "\nimport { promptOf } from './engine.mjs';\nvoid promptOf;\n"), 'sim');
    expect(checkImports(root)).toEqual(['circle: sim/endpoints.mjs -> sim/engine.mjs -> sim/endpoints.mjs']);
    const r = run(root);
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('circle: sim/endpoints.mjs -> sim/engine.mjs -> sim/endpoints.mjs');
  });

  it('counts a JSDoc type import in a circle', () => {
    const root = plantedTree((sim) => {
      writeFileSync(path.join(sim, 'model/planted-a.mjs'), "import { b } from './planted-b.mjs';\n/** @typedef {number} A */\nexport const a = () => b;\n");
      writeFileSync(path.join(sim, 'model/planted-b.mjs'), "/** @typedef {import('./planted-a.mjs').A} A */\n/** @type {A} */\nexport const b = 1;\n");
    }, 'sim');
    expect(checkImports(root)).toEqual(['circle: sim/model/planted-a.mjs -> sim/model/planted-b.mjs -> sim/model/planted-a.mjs']);
  });
});

describe('importsOf', () => {
  it('reads import, import type, export from, side-effect and dynamic imports, and only relative ones', () => {
    const text = [
      'import { a } from "./a";',
      'import type {\n  B,\n  C,\n} from "../b";',
      "export { d } from './d';",
      'import "./side";',
      'const e = await import("./e");',
      'import { Hono } from "hono";',
      '// "from ./not" in a comment line is not an import',
    ].join('\n');
    expect(importsOf(text)).toEqual(['./a', '../b', './d', './side', './e']);
  });
});
