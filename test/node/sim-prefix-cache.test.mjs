import { describe, expect, it } from 'vitest';
import { PrefixCache, chainedBlockHashes } from '../../sim/prefix-cache.mjs';

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

describe('prefix cache LRU', () => {
  it('matches only the leading run of blocks', () => {
    const cache = new PrefixCache(10);
    cache.insert(['a', 'b', 'c']);
    expect(cache.match(['a', 'b', 'c', 'd'])).toBe(3);
    expect(cache.match(['a', 'x', 'c'])).toBe(1);
    expect(cache.match(['x', 'a'])).toBe(0);
  });

  it('never holds more than its capacity', () => {
    const cache = new PrefixCache(3);
    cache.insert(['a', 'b', 'c', 'd', 'e']);
    expect(cache.size).toBe(3);
    expect(cache.evictions).toBe(2);
  });

  it('evicts the least recently used blocks first', () => {
    const cache = new PrefixCache(4);
    cache.insert(['a1', 'a2']);
    cache.insert(['b1', 'b2']);
    cache.match(['a1', 'a2']); // a is now more recent than b
    cache.insert(['c1']);
    expect(cache.has('b2')).toBe(false); // b's tail goes first
    expect(cache.has('b1')).toBe(true);
    cache.insert(['d1']);
    expect(cache.has('b1')).toBe(false);
    expect(['a1', 'a2', 'c1', 'd1'].every((h) => cache.has(h))).toBe(true);
  });

  it('evicts the tail of a chain before its head', () => {
    const cache = new PrefixCache(3);
    cache.insert(['h0', 'h1', 'h2']);
    cache.insert(['x']);
    expect(cache.keys()).toEqual(['h1', 'h0', 'x']);
    expect(cache.match(['h0', 'h1', 'h2'])).toBe(2);
  });

  it('peekMatch does not change the order', () => {
    const cache = new PrefixCache(2);
    cache.insert(['a']);
    cache.insert(['b']);
    expect(cache.peekMatch(['a'])).toBe(1);
    cache.insert(['c']);
    expect(cache.has('a')).toBe(false);
  });

  it('clear empties it', () => {
    const cache = new PrefixCache(2);
    cache.insert(['a']);
    cache.clear();
    expect(cache.size).toBe(0);
  });
});
