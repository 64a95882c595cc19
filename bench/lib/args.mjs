// Command-line options: `--name value`, `--name=value` and bare flags.

export const ALL_POLICIES = ['round_robin', 'affinity', 'least_load', 'cache_aware'];

/**
 * @param {string[]} argv
 * @returns {{ scenario: string | undefined, options: Record<string, string | true> }}
 */
export function parseArgs(argv) {
  /** @type {Record<string, string | true>} */
  const options = {};
  /** @type {string | undefined} */
  let scenario;
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg.startsWith('--')) {
      const eq = arg.indexOf('=');
      if (eq > 0) options[arg.slice(2, eq)] = arg.slice(eq + 1);
      else if (i + 1 < argv.length && !argv[i + 1].startsWith('--')) options[arg.slice(2)] = argv[++i];
      else options[arg.slice(2)] = true;
    } else if (scenario === undefined) scenario = arg;
    else throw new Error(`unexpected argument ${arg}`);
  }
  return { scenario, options };
}

/** @param {Record<string, string | true>} options @param {string} name @param {number} fallback */
export function numberOption(options, name, fallback) {
  const v = options[name];
  if (v === undefined) return fallback;
  const n = Number(v);
  if (v === true || !Number.isFinite(n)) throw new Error(`--${name} needs a number`);
  return n;
}

/** @param {Record<string, string | true>} options @param {string} name @param {string | undefined} [fallback] */
export function stringOption(options, name, fallback) {
  const v = options[name];
  if (v === undefined) return fallback;
  if (v === true) throw new Error(`--${name} needs a value`);
  return v;
}

/** @param {Record<string, string | true>} options @param {string[]} allowed @param {string[]} [fallback] */
export function listOption(options, name = 'policy', allowed = ALL_POLICIES, fallback = allowed) {
  const v = stringOption(options, name);
  if (v === undefined) return fallback;
  const list = v
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
  for (const item of list) if (!allowed.includes(item)) throw new Error(`--${name}: unknown ${item} (one of ${allowed.join(', ')})`);
  return list;
}

/**
 * `--engine key=value,key=value`: engine options (numbers or booleans) merged over a preset, for
 * calibration runs (docs/simulator.md says which were calibrated, on what).
 * @param {Record<string, string | true>} options
 * @returns {Record<string, number | boolean | string>}
 */
export function engineOverrides(options) {
  const v = stringOption(options, 'engine');
  if (v === undefined) return {};
  /** @type {Record<string, number | boolean | string>} */
  const out = {};
  for (const pair of v.split(',').filter(Boolean)) {
    const [k, raw] = pair.split('=');
    if (!k || raw === undefined) throw new Error(`--engine: ${pair} is not key=value`);
    out[k.trim()] = raw === 'true' ? true : raw === 'false' ? false : Number.isFinite(Number(raw)) ? Number(raw) : raw;
  }
  return out;
}
