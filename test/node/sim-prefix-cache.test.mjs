import { describe, expect, it } from 'vitest';
import { chainedBlockHashes } from '../../sim/prefix-cache.mjs';

// The prefix cache itself (LRU in KV memory) is tested in sim-model.test.mjs.

describe('chained block hashes', () => {
  const block = (c) => c.repeat(8);

  it('hashes full blocks only', () => {
    expect(chainedBlockHashes('', 8)).toEqual([]);
    expect(chainedBlockHashes('a'.repeat(7), 8)).toHaveLength(0);
    expect(chainedBlockHashes('a'.repeat(17), 8)).toHaveLength(2);
  });

  it('gives the same leading hashes to prompts that share a prefix', () => {
    const a = chainedBlockHashes(block('a') + block('b') + block('c'), 8);
    const b = chainedBlockHashes(block('a') + block('b') + block('z') + block('y'), 8);
    expect(b.slice(0, 2)).toEqual(a.slice(0, 2));
    expect(b[2]).not.toBe(a[2]);
  });

  it('a change in block k changes hashes k.. but none before', () => {
    const base = ['a', 'b', 'c', 'd', 'e'].map(block);
    const changed = [...base];
    changed[2] = block('X');
    const h1 = chainedBlockHashes(base.join(''), 8);
    const h2 = chainedBlockHashes(changed.join(''), 8);
    expect(h2.slice(0, 2)).toEqual(h1.slice(0, 2));
    for (let k = 2; k < 5; k++) expect(h2[k]).not.toBe(h1[k]);
  });

  it('chains: the same block text after a different prefix hashes differently', () => {
    const h1 = chainedBlockHashes(block('a') + block('c'), 8);
    const h2 = chainedBlockHashes(block('b') + block('c'), 8);
    expect(h1[1]).not.toBe(h2[1]);
  });

  it('accepts token id arrays', () => {
    const h1 = chainedBlockHashes([1, 2, 3, 4, 5], 2);
    expect(h1).toHaveLength(2);
    expect(chainedBlockHashes([1, 2, 3, 9], 2)).toEqual([h1[0], expect.not.stringMatching(h1[1])]);
  });
});
