import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { parseArgs, listOption } from '../../bench/lib/args.mjs';
import { markdownTable, svgPathFor, writeReport } from '../../bench/lib/report.mjs';
import { maxOverMean, percentile } from '../../bench/lib/stats.mjs';
import { barChartSvg } from '../../bench/lib/svg.mjs';
import { vllmPrefillBody } from '../../bench/scenarios/overhead.mjs';

const dir = mkdtempSync(path.join(os.tmpdir(), 'bench-output-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('percentile (nearest rank)', () => {
  it('picks the sample at rank ceil(p/100 * n)', () => {
    const xs = [5, 1, 4, 2, 3, 6, 7, 8, 9, 10];
    expect(percentile(xs, 50)).toBe(5);
    expect(percentile(xs, 99)).toBe(10);
    expect(percentile(xs, 90)).toBe(9);
    expect(percentile(xs, 0)).toBe(1);
    expect(percentile(xs, 100)).toBe(10);
    expect(percentile([7], 99)).toBe(7);
  });
  it('is NaN without samples and does not reorder its input', () => {
    expect(percentile([], 50)).toBeNaN();
    const xs = [3, 1, 2];
    percentile(xs, 50);
    expect(xs).toEqual([3, 1, 2]);
    expect(() => percentile(xs, 101)).toThrow(RangeError);
  });
  it('max/mean is 1 when even', () => {
    expect(maxOverMean([4, 4, 4])).toBe(1);
    expect(maxOverMean([6, 2, 4])).toBe(1.5);
  });
});

describe('report writers', () => {
  const chart = {
    title: 'a <b> & c',
    series: ['round_robin', 'affinity'],
    figures: [
      { name: 'hit ratio', values: [0.1, 0.3], reference: { value: 0.366, label: 'ceiling' } },
      { name: 'p99', values: [12, NaN] },
    ],
  };

  it('writes the JSON and an SVG with the same basename', () => {
    const json = path.join(dir, 'sub', 'trace-8.json');
    const written = writeReport(json, { scenario: 'trace', ceiling: 0.366, results: [{ policy: 'affinity', hitRatio: 0.3, maxOverMean: 1.2 }] }, chart);
    expect(written.svg).toBe(path.join(dir, 'sub', 'trace-8.svg'));
    expect(JSON.parse(readFileSync(json, 'utf8'))).toEqual({ scenario: 'trace', ceiling: 0.366, results: [{ policy: 'affinity', hitRatio: 0.3, maxOverMean: 1.2 }] });
    expect(readFileSync(written.svg, 'utf8')).toBe(barChartSvg(chart));
    expect(svgPathFor('x/y.json')).toBe('x/y.svg');
  });

  it('draws one bar per series and figure, escapes text, and survives NaN', () => {
    const svg = barChartSvg(chart);
    expect(svg.startsWith('<svg xmlns="http://www.w3.org/2000/svg"')).toBe(true);
    expect(svg.trim().endsWith('</svg>')).toBe(true);
    expect(svg).toContain('a &lt;b&gt; &amp; c');
    expect(svg.match(/<rect [^>]*><title>/g)).toHaveLength(4);
    expect(svg).toContain('n/a');
    expect(svg).not.toContain('NaN');
    expect(svg).toContain('ceiling');
  });

  it('renders a markdown table', () => {
    expect(
      markdownTable(
        ['a', 'b'],
        [
          ['x', 0.12345],
          ['y', 3],
        ],
      ),
    ).toBe('| a | b |\n|---|---|\n| x | 0.123 |\n| y | 3 |');
  });
});

describe('command line', () => {
  it('reads the scenario, --k v, --k=v and flags; policies are checked', () => {
    const { scenario, options } = parseArgs(['trace', '--nodes', '8', '--json=out.json', '--no-memory', '--policy', 'affinity,cache_aware']);
    expect(scenario).toBe('trace');
    expect(options).toEqual({ nodes: '8', json: 'out.json', 'no-memory': true, policy: 'affinity,cache_aware' });
    expect(listOption(options)).toEqual(['affinity', 'cache_aware']);
    expect(() => listOption({ policy: 'random' })).toThrow(/unknown random/);
    expect(listOption({})).toEqual(['round_robin', 'affinity', 'least_load', 'cache_aware']);
  });
});

describe('direct vllm prefill leg (SPEC 4 field rules)', () => {
  it('forces a one-token non-stream prefill and asks for a remote decode', () => {
    const body = {
      model: 'm',
      messages: [],
      stream: true,
      stream_options: { include_usage: true },
      max_tokens: 64,
      max_completion_tokens: 64,
      min_tokens: 2,
      min_completion_tokens: 2,
      temperature: 0,
    };
    expect(vllmPrefillBody(body)).toEqual({
      model: 'm',
      messages: [],
      stream: false,
      max_tokens: 1,
      max_completion_tokens: 1,
      temperature: 0,
      kv_transfer_params: { do_remote_decode: true, do_remote_prefill: false, remote_engine_id: null, remote_block_ids: null, remote_host: null, remote_port: null },
    });
    expect(body.stream).toBe(true);
  });
});
