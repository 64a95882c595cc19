// Every relative link of the README, CONTRIBUTING and docs/ resolves: the file exists, and an
// anchor names a heading of the page it points into (GitHub's heading ids). The README is the
// front door and docs/ the manual (issue 26): a link that leads nowhere is a closed door.
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');

const PAGES = [
  'README.md',
  'CONTRIBUTING.md',
  ...readdirSync(path.join(REPO_ROOT, 'docs'))
    .filter((f) => f.endsWith('.md'))
    .map((f) => `docs/${f}`),
];

/** The page's text outside fenced code blocks and inline code: where links and headings are. */
export function prose(text) {
  let fence = null;
  return text
    .split('\n')
    .map((line) => {
      const m = /^\s*(`{3,}|~{3,})/.exec(line);
      if (m && (fence === null || m[1][0] === fence[0])) {
        fence = fence === null ? m[1] : null;
        return '';
      }
      return fence === null ? line.replace(/`[^`]*`/g, (code) => code.replace(/[[\]()]/g, ' ')) : '';
    })
    .join('\n');
}

/** GitHub's id for a heading: lower case, punctuation dropped, each space a hyphen; repeats get -1, -2, ... */
export function headingIds(text) {
  const seen = new Map();
  const ids = new Set();
  let fence = false;
  for (const line of text.split('\n')) {
    if (/^\s*(`{3,}|~{3,})/.test(line)) fence = !fence;
    const m = !fence && /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line);
    if (!m) continue;
    const base = m[1]
      .replace(/\[([^\]]*)\]\([^)]*\)/g, '$1')
      .replace(/<[^>]+>/g, '')
      .toLowerCase()
      .replace(/[^\p{L}\p{N}\s_-]/gu, '')
      .replace(/\s/g, '-');
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    ids.add(n ? `${base}-${n}` : base);
  }
  return ids;
}

/** The relative links of a page: `[text](target)` and `![alt](target)`, with their line numbers. */
export function relativeLinks(text) {
  const links = [];
  prose(text)
    .split('\n')
    .forEach((line, i) => {
      for (const m of line.matchAll(/\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)) {
        const target = m[1];
        if (!/^[a-z][a-z0-9+.-]*:/i.test(target)) links.push({ target, line: i + 1 });
      }
    });
  return links;
}

/** What is wrong with a page's links, one line each. */
function brokenLinks(page) {
  const file = path.join(REPO_ROOT, page);
  const text = readFileSync(file, 'utf8');
  const problems = [];
  for (const { target, line } of relativeLinks(text)) {
    const [rawPath, anchor] = target.split('#');
    const to = rawPath ? path.resolve(path.dirname(file), decodeURI(rawPath)) : file;
    const where = `${page}:${line} -> ${target}`;
    if (!existsSync(to)) problems.push(`${where}: no such file`);
    else if (anchor !== undefined && to.endsWith('.md') && !headingIds(readFileSync(to, 'utf8')).has(decodeURIComponent(anchor).toLowerCase())) {
      problems.push(`${where}: no heading with that id in ${path.relative(REPO_ROOT, to)}`);
    }
  }
  return problems;
}

describe('the documentation links', () => {
  it.each(PAGES)('%s: every relative link and anchor resolves', (page) => {
    expect(brokenLinks(page)).toEqual([]);
  });

  it('the README is a front door: at most 250 lines, the two commands, a table of contents into docs/', () => {
    const readme = readFileSync(path.join(REPO_ROOT, 'README.md'), 'utf8');
    expect(readme.split('\n').length).toBeLessThanOrEqual(250);
    // CI runs "the README's test command": `npm test`, exactly
    expect(readme).toContain('npm install && npm start');
    expect(readme).toMatch(/^npm test\b/m);
    const linked = new Set(relativeLinks(readme).map((l) => l.target.split('#')[0]));
    const pages = readdirSync(path.join(REPO_ROOT, 'docs')).filter((f) => f.endsWith('.md'));
    expect(pages.filter((p) => !linked.has(`docs/${p}`))).toEqual([]);
  });
});

describe('the link checker', () => {
  it('gives headings the ids GitHub gives them', () => {
    const ids = headingIds(
      [
        '## multiturn (seed 000) — 2P+2D vllm on H200 + Qwen3-14B, 60 conversations x 5 turns (8,192 tokens + 2,048 a turn, 128 out), concurrency 12',
        '### The per-request decision: conditional disaggregation, cache-hit feedback, route receipts (`policy.disaggregation`)',
        '## Routes',
        '## Routes',
        '```sh',
        '# not a heading',
        '```',
      ].join('\n'),
    );
    expect([...ids]).toEqual([
      'multiturn-seed-000--2p2d-vllm-on-h200--qwen3-14b-60-conversations-x-5-turns-8192-tokens--2048-a-turn-128-out-concurrency-12',
      'the-per-request-decision-conditional-disaggregation-cache-hit-feedback-route-receipts-policydisaggregation',
      'routes',
      'routes-1',
    ]);
  });

  it('finds relative links, not those in code or to other sites', () => {
    const text = ['See [a](docs/a.md#x) and ![c](bench/c.svg).', '`[not](a link)` [site](https://example.com)', '```', '[in](code.md)', '```', '[same page](#top)'].join('\n');
    expect(relativeLinks(text)).toEqual([
      { target: 'docs/a.md#x', line: 1 },
      { target: 'bench/c.svg', line: 1 },
      { target: '#top', line: 6 },
    ]);
  });
});
