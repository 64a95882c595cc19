// The router's GET /metrics read back by a scenario: Prometheus text into samples, and sums of a
// series by one label (what the runs report: decisions by mode and reason, predicted vs reported
// cached tokens by node).

/** @typedef {{ name: string, labels: Record<string, string>, value: number }} Sample */

/**
 * Prometheus text exposition into samples (comments and malformed lines skipped).
 * @param {string} text @returns {Sample[]}
 */
export function parsePrometheus(text) {
  /** @type {Sample[]} */
  const out = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    /** @type {Record<string, string>} */
    const labels = {};
    for (const l of (m[3] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2].replace(/\\(.)/g, (_, c) => (c === 'n' ? '\n' : c));
    const value = Number(m[4]);
    if (Number.isFinite(value)) out.push({ name: m[1], labels, value });
  }
  return out;
}

/**
 * Sum of a series' samples grouped by the values of `labels` (joined by "/"), e.g. the decisions
 * by `mode/reason`.
 * @param {Sample[]} samples @param {string} name @param {string[]} labels
 * @returns {Record<string, number>}
 */
export function sumBy(samples, name, labels) {
  /** @type {Record<string, number>} */
  const out = {};
  for (const s of samples) {
    if (s.name !== name) continue;
    const key = labels.map((l) => s.labels[l] ?? '').join('/');
    out[key] = (out[key] ?? 0) + s.value;
  }
  return out;
}

/** @param {Sample[]} samples @param {string} name */
export function total(samples, name) {
  return samples.filter((s) => s.name === name).reduce((a, s) => a + s.value, 0);
}

/** GET the router's /metrics. @param {string} routerUrl @returns {Promise<Sample[]>} */
export async function routerMetrics(routerUrl) {
  const res = await fetch(`${routerUrl}/metrics`);
  return parsePrometheus(await res.text());
}
