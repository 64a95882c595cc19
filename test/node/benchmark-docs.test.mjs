// docs/benchmark.md's results blocks are generated from the committed JSON in bench/results/ by
// `npm run bench -- docs` (issue 26): a new run committed without regenerating, or a hand edit
// inside a block, fails here until the page says what the JSON says.
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { BENCHMARK_DOC, RESULTS_DIR, beginMarker, blockNames, regenerate, resultsReader } from '../../bench/scenarios/docs.mjs';

const doc = readFileSync(BENCHMARK_DOC, 'utf8');
const read = resultsReader(RESULTS_DIR);

describe('docs/benchmark.md: the results tables are the committed JSON', () => {
  it('every generated block is what npm run bench -- docs writes from bench/results/', () => {
    expect(blockNames(doc).length).toBeGreaterThan(0);
    // compared block by block, so a failure names the block that is out of date
    const regenerated = regenerate(doc, read);
    for (const name of blockNames(doc)) {
      const of = (/** @type {string} */ text) => text.slice(text.indexOf(beginMarker(name)), text.indexOf(`<!-- end of generated ${name} -->`));
      expect(of(doc), `bench/results/${name}.json: run npm run bench -- docs`).toBe(of(regenerated));
    }
    expect(regenerated).toBe(doc);
  });

  it('each block says which command wrote its JSON and when', () => {
    for (const name of blockNames(doc)) {
      const { report, command } = read(name);
      const block = doc.slice(doc.indexOf(beginMarker(name)));
      expect(block).toContain(`written by \`${command}\``);
      expect(block).toContain(`finished ${report.finishedAt}`);
    }
  });

  it('regenerating is idempotent', () => {
    const once = regenerate(doc, read);
    expect(regenerate(once, read)).toBe(once);
  });

  it('a hand edit inside a block is undone, text outside the blocks is kept', () => {
    const [name] = blockNames(doc);
    const edited = `intro kept\n\n${beginMarker(name)}\n\n| a hand-typed | table |\n\n<!-- end of generated ${name} -->\n\noutro kept\n`;
    const out = regenerate(edited, read);
    expect(out).not.toContain('hand-typed');
    expect(out.startsWith('intro kept\n\n')).toBe(true);
    expect(out.endsWith('\n\noutro kept\n')).toBe(true);
  });

  it('the page has no results table left outside a generated block from the runs it names', () => {
    // the hand-copied tables this page used to hold began with these headers
    const outside = doc.replace(/<!-- generated from [\s\S]*?<!-- end of generated [\w.-]+ -->/g, '');
    for (const header of ['| config | nodes (clients) |', '| pdGroup |', '| policy | hit ratio |', '| policy | conc. |', '| op | policy |']) {
      expect(outside).not.toContain(header);
    }
  });
});
