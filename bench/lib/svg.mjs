// A hand-written grouped bar chart (one group per figure, one bar per policy), no dependencies.

const COLORS = ['#4e79a7', '#f28e2b', '#59a14f', '#e15759', '#76b7b2', '#edc948', '#b07aa1', '#9c755f'];

/** @param {string} s */
function esc(s) {
  return String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
}

/** @param {number} v */
function label(v) {
  if (!Number.isFinite(v)) return 'n/a';
  if (Number.isInteger(v)) return String(v);
  if (Math.abs(v) >= 1000) return String(Math.round(v));
  if (Math.abs(v) >= 10) return v.toFixed(1);
  return v.toFixed(3).replace(/\.?0+$/, '') || '0';
}

/**
 * Each figure gets its own panel with its own scale (figures have different units), with one bar
 * per series (policy) and the value written above the bar. An optional reference line per
 * figure (e.g. the trace's ceiling) is drawn dashed across its panel.
 * @param {object} chart
 * @param {string} chart.title
 * @param {string[]} chart.series bar names, e.g. policies
 * @param {{ name: string, values: number[], reference?: { value: number, label: string } }[]} chart.figures
 * @returns {string} SVG document
 */
export function barChartSvg({ title, series, figures }) {
  const panelW = Math.max(160, 44 * series.length + 40);
  const panelH = 220;
  const top = 60;
  const left = 20;
  // wide enough for the panels, the legend and the title
  const width = Math.ceil(Math.max(left * 2 + panelW * figures.length, left * 2 + 130 * series.length, title.length * 8.5 + 40));
  const height = top + panelH + 70;
  const out = [];
  out.push(`<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="system-ui, sans-serif" font-size="11">`);
  out.push(`<rect width="100%" height="100%" fill="#fff"/>`);
  out.push(`<text x="${width / 2}" y="20" text-anchor="middle" font-size="15" font-weight="600">${esc(title)}</text>`);
  series.forEach((name, i) => {
    const x = left + i * 130;
    out.push(`<rect x="${x}" y="32" width="12" height="12" fill="${COLORS[i % COLORS.length]}"/><text x="${x + 16}" y="42">${esc(name)}</text>`);
  });
  figures.forEach((figure, f) => {
    const x0 = left + f * panelW;
    const base = top + panelH;
    const finite = figure.values.filter(Number.isFinite);
    const maxV = Math.max(1e-9, ...finite, figure.reference?.value ?? 0) * 1.15;
    const barW = (panelW - 40) / series.length - 6;
    out.push(`<line x1="${x0 + 15}" y1="${base}" x2="${x0 + panelW - 15}" y2="${base}" stroke="#333"/>`);
    figure.values.forEach((v, i) => {
      const h = Number.isFinite(v) ? Math.max(0, (v / maxV) * (panelH - 20)) : 0;
      const x = x0 + 20 + i * (barW + 6);
      out.push(
        `<rect x="${x.toFixed(1)}" y="${(base - h).toFixed(1)}" width="${barW.toFixed(1)}" height="${h.toFixed(1)}" fill="${COLORS[i % COLORS.length]}"><title>${esc(series[i])}: ${esc(label(v))}</title></rect>`,
      );
      out.push(`<text x="${(x + barW / 2).toFixed(1)}" y="${(base - h - 4).toFixed(1)}" text-anchor="middle" font-size="10">${esc(label(v))}</text>`);
    });
    if (figure.reference) {
      const y = base - (figure.reference.value / maxV) * (panelH - 20);
      out.push(`<line x1="${x0 + 15}" y1="${y.toFixed(1)}" x2="${x0 + panelW - 15}" y2="${y.toFixed(1)}" stroke="#c00" stroke-dasharray="4 3"/>`);
      out.push(`<text x="${x0 + panelW - 15}" y="${(y - 3).toFixed(1)}" text-anchor="end" fill="#c00" font-size="10">${esc(figure.reference.label)}</text>`);
    }
    out.push(`<text x="${x0 + panelW / 2}" y="${base + 20}" text-anchor="middle" font-weight="600">${esc(figure.name)}</text>`);
  });
  out.push('</svg>');
  return out.join('\n') + '\n';
}
