// The figures the README shows as its proof are the committed results' (bench/results/*.json),
// rounded as the README rounds them: a benchmark re-run that moves them fails here until the
// README says what the JSON says (numbers are never typed twice unchecked).
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const readme = readFileSync(path.join(REPO_ROOT, 'README.md'), 'utf8');
const results = (name) => JSON.parse(readFileSync(path.join(REPO_ROOT, 'bench/results', name), 'utf8'));

/** The README's proof table row that starts with `what`. */
const row = (what) => readme.split('\n').find((line) => line.startsWith(`| ${what}`)) ?? '';

describe("the README's figures are the results' JSON", () => {
  it('multiturn (seed 000): cross-node prefix fetches and throughput, round-robin against P+D affinity', () => {
    const r = Object.fromEntries(results('multiturn.json').results.map((x) => [x.policy, x]));
    const line = row('multi-turn chat');
    expect(line).toContain(`| ${r.round_robin.prefillCrossNodeFetches} of 240 |`);
    expect(line).toContain(`**${r.pd_affinity.prefillCrossNodeFetches}** (P+D affinity)`);
    expect(line).toContain(`${Math.round(r.round_robin.outTokPerS)} -> ${Math.round(r.pd_affinity.outTokPerS)} output tok/s`);
  });

  it('agentic (seed 002): hit ratio and TTFT p50 of colocated round-robin against cache_aware', () => {
    const pick = (policy) => results('agentic.json').results.find((x) => x.config === 'colocated-8' && x.policy === policy);
    const [rr, ca] = [pick('round_robin'), pick('cache_aware')];
    const line = row('agentic trace');
    expect(line).toContain(`| ${rr.hitRatio.toFixed(2)}, ${(rr.ttftP50Ms / 1000).toFixed(1)} s |`);
    expect(line).toContain(`**${ca.hitRatio.toFixed(2)}, ${(ca.ttftP50Ms / 1000).toFixed(1)} s**`);
  });

  it('trace, 8 nodes: the share of the ceiling round-robin and cache_aware find, and cache_aware balance in prefill tokens', () => {
    const trace = results('trace-8.json');
    const share = (policy) => (trace.results.find((x) => x.policy === policy).hitRatio / trace.ceiling).toFixed(2);
    const ca = trace.results.find((x) => x.policy === 'cache_aware');
    const line = row('Mooncake conversation trace');
    expect(line).toContain(`| ${share('round_robin')} |`);
    expect(line).toContain(`**${share('cache_aware')}**`);
    expect(line).toContain(`within ${Math.ceil((ca.maxOverMeanTokens - 1) * 100)}% of the mean`);
  });
});
