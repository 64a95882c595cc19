// A tiny renderer of the Prometheus text exposition format 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/).

export const PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8";

export type Labels = Record<string, string>;

export interface Sample {
  labels?: Labels;
  value: number;
}

export interface HistogramSample {
  labels?: Labels;
  /** upper bounds, ascending (the +Inf bucket is added) */
  bounds: readonly number[];
  /** observations per bucket, NOT cumulative: counts[i] fell in (bounds[i-1], bounds[i]] */
  counts: readonly number[];
  sum: number;
  count: number;
}

export type MetricFamily =
  | { name: string; help: string; type: "counter" | "gauge"; samples: Sample[] }
  | { name: string; help: string; type: "histogram"; samples: HistogramSample[] };

/** The format's only escapes: `\\`, a newline as `\n` and, in label values, `\"`. */
const escaped = (text: string, chars: RegExp) => text.replace(chars, (c) => (c === "\n" ? "\\n" : `\\${c}`));
const escapeHelp = (text: string) => escaped(text, /[\\\n]/g);
const escapeLabelValue = (text: string) => escaped(text, /[\\\n"]/g);

/** A sample value as the format writes it: String(NaN) is already "NaN", the infinities are not. */
export function formatValue(value: number): string {
  if (value === Infinity) return "+Inf";
  if (value === -Infinity) return "-Inf";
  return String(value);
}

function labelText(labels: Labels | undefined, extra?: [string, string]): string {
  const pairs = Object.entries(labels ?? {});
  if (extra) pairs.push(extra);
  if (pairs.length === 0) return "";
  return `{${pairs.map(([k, v]) => `${k}="${escapeLabelValue(v)}"`).join(",")}}`;
}

export function renderMetrics(families: readonly MetricFamily[]): string {
  const lines: string[] = [];
  for (const family of families) {
    lines.push(`# HELP ${family.name} ${escapeHelp(family.help)}`, `# TYPE ${family.name} ${family.type}`);
    if (family.type === "histogram") {
      for (const h of family.samples) {
        let cumulative = 0;
        h.bounds.forEach((bound, i) => {
          cumulative += h.counts[i] ?? 0;
          lines.push(`${family.name}_bucket${labelText(h.labels, ["le", formatValue(bound)])} ${cumulative}`);
        });
        lines.push(`${family.name}_bucket${labelText(h.labels, ["le", "+Inf"])} ${h.count}`);
        lines.push(`${family.name}_sum${labelText(h.labels)} ${formatValue(h.sum)}`);
        lines.push(`${family.name}_count${labelText(h.labels)} ${h.count}`);
      }
    } else {
      for (const s of family.samples) lines.push(`${family.name}${labelText(s.labels)} ${formatValue(s.value)}`);
    }
  }
  return lines.join("\n") + "\n";
}
