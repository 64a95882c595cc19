// The operators' status page: one self-contained HTML document (inline CSS and JS, no
// framework, no external assets). It carries no data itself; its script polls /status.json
// every 2 s with the admin token kept in sessionStorage (sent as a bearer header, never in a
// URL the server sees), keeps the samples in the browser and draws them as inline SVG charts:
// rates and percentiles are derived from the cumulative counters and histograms of consecutive
// samples. Per-node gauges (in flight, KV use) also come with the last 15 minutes the Durable
// Object kept (`history`), so those charts are filled the moment the page opens.
//
// A link may carry the token in its fragment (`/status#token=...`, as `npm start` prints it):
// fragments never reach the server, and the page moves it into sessionStorage and strips it
// from the address bar at once.

const SCRIPT = `
(() => {
  "use strict";
  const KEY = "pd-router-admin-token";
  const POLL_MS = 2000;
  const KEEP_MS = 15 * 60 * 1000;   // samples kept in this tab
  const VIEW_MS = 15 * 60 * 1000;   // time shown by the charts (the object keeps as much history)
  const MIN_VIEW_MS = 60 * 1000;    // a young page still spreads its points over a minute
  const SMOOTH_MS = 10 * 1000;      // percentiles and hit ratio over the last 10 s of samples
  const PALETTE = ["#2563eb", "#ea580c", "#16a34a", "#9333ea", "#0891b2", "#db2777", "#ca8a04", "#4b5563", "#7c3aed", "#059669"];
  const SVG = "http://www.w3.org/2000/svg";
  const isPublic = document.body.dataset.public === "true";
  const $ = (id) => document.getElementById(id);
  let previous = null;
  let timer = null;
  const samples = [];   // { t, data }
  let kept = [];        // the object's per-node points: { t, nodes: [{ node, inflight, kvUsage, queue }] }
  const events = [];    // { t, node, kind: "failure" | "eject" | "down" | "up", count }
  const colours = new Map();

  // ---- token ------------------------------------------------------------------------
  const fragment = /^#token=(.+)$/.exec(location.hash);
  if (fragment) {
    sessionStorage.setItem(KEY, decodeURIComponent(fragment[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }

  function el(tag, text, attrs) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    return node;
  }
  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = String(text);
    return node;
  }
  function colour(id) {
    if (!colours.has(id)) colours.set(id, PALETTE[colours.size % PALETTE.length]);
    return colours.get(id);
  }

  function showLogin(message) {
    $("login").hidden = false;
    $("dashboard").hidden = true;
    $("login-message").textContent = message || "";
  }

  function health(n) {
    if (!n.probeUp) return ["down", "bad"];
    if (n.breaker === "open") return ["ejected", "bad"];
    if (n.breaker === "half_open") return ["half-open", "warn"];
    if (n.drain) return ["draining", "warn"];
    return ["up", "good"];
  }

  // ---- derived series -----------------------------------------------------------------
  const nodeTotal = (n) => n.requestsTotal.prefill + n.requestsTotal.decode;
  const routed = (d) => d.requests.filter((r) => r.route.startsWith("/v1/") && r.route !== "/v1/models" && r.route !== "/v1/route").reduce((s, r) => s + r.count, 0);

  /** the sample at least ms older than samples[i] (or the oldest) */
  function before(i, ms) {
    let j = i - 1;
    while (j > 0 && samples[i].t - samples[j].t < ms) j--;
    return j >= 0 ? samples[j] : null;
  }

  /** Prometheus-style histogram_quantile over the difference of two cumulative histograms. */
  function quantile(q, now, old) {
    const total = now.count - (old ? old.count : 0);
    if (total <= 0) return null;
    const rank = q * total;
    let cum = 0;
    for (let i = 0; i < now.bounds.length; i++) {
      const c = now.counts[i] - (old ? old.counts[i] : 0);
      if (cum + c >= rank && c > 0) {
        const lo = i === 0 ? 0 : now.bounds[i - 1];
        return lo + (now.bounds[i] - lo) * ((rank - cum) / c);
      }
      cum += c;
    }
    return now.bounds[now.bounds.length - 1]; // in the +Inf bucket: at least the last bound
  }

  function series(nodes) {
    const rps = new Map(nodes.map((n) => [n.id, []]));
    const inflight = new Map(nodes.map((n) => [n.id, []]));
    const kv = new Map(nodes.map((n) => [n.id, []]));
    const total = [], p50 = [], p99 = [], hit = [];
    // before this tab's first sample: the object's history
    const firstSample = samples.length ? samples[0].t : Infinity;
    for (const point of kept) {
      if (point.t >= firstSample) break;
      for (const m of point.nodes) {
        if (inflight.has(m.node)) inflight.get(m.node).push([point.t, m.inflight]);
        if (kv.has(m.node) && m.kvUsage !== null) kv.get(m.node).push([point.t, 100 * m.kvUsage]);
      }
    }
    for (let i = 0; i < samples.length; i++) {
      const { t, data } = samples[i];
      const byId = new Map(data.nodes.map((n) => [n.id, n]));
      for (const n of nodes) {
        const cur = byId.get(n.id);
        if (cur) inflight.get(n.id).push([t, cur.inflight.prefill + cur.inflight.decode]);
        // the engine's reading while it is fresh (a stale one is not what the node does now)
        if (cur && cur.signals && cur.signals.projected && cur.signals.kvUsage !== null) kv.get(n.id).push([t, 100 * cur.signals.kvUsage]);
      }
      if (i === 0) continue;
      const prev = samples[i - 1];
      const dt = Math.max(0.001, (t - prev.t) / 1000);
      const old = new Map(prev.data.nodes.map((n) => [n.id, n]));
      for (const n of nodes) {
        const cur = byId.get(n.id), was = old.get(n.id);
        if (cur && was) rps.get(n.id).push([t, Math.max(0, nodeTotal(cur) - nodeTotal(was)) / dt]);
      }
      total.push([t, Math.max(0, routed(data) - routed(prev.data)) / dt]);
      const base = before(i, SMOOTH_MS);
      if (data.latency && base && base.data.latency) {
        const a = quantile(0.5, data.latency.ttfb, base.data.latency.ttfb);
        const b = quantile(0.99, data.latency.ttfb, base.data.latency.ttfb);
        if (a !== null) p50.push([t, a * 1000]);
        if (b !== null) p99.push([t, b * 1000]);
      }
      if (base) {
        const looked = data.prefix.lookedUpBlocks - base.data.prefix.lookedUpBlocks;
        if (looked > 0) hit.push([t, (100 * (data.prefix.matchedBlocks - base.data.prefix.matchedBlocks)) / looked]);
      }
    }
    return { rps, inflight, kv, total, p50, p99, hit };
  }

  function noteEvents(data, prev) {
    if (!prev) {
      // the state the page found: an ejection or an outage already under way
      for (const n of data.nodes) {
        if (n.breaker === "open") events.push({ t: data.now, node: n.id, kind: "eject", count: 1 });
        if (!n.probeUp) events.push({ t: data.now, node: n.id, kind: "down", count: 1 });
      }
      return;
    }
    const old = new Map(prev.nodes.map((n) => [n.id, n]));
    for (const n of data.nodes) {
      const was = old.get(n.id);
      if (!was) continue;
      const failed = n.failuresTotal - was.failuresTotal;
      if (failed > 0) events.push({ t: data.now, node: n.id, kind: "failure", count: failed });
      if (n.ejectedUntil > was.ejectedUntil && n.ejectedUntil > data.now) events.push({ t: data.now, node: n.id, kind: "eject", count: 1 });
      if (was.probeUp && !n.probeUp) events.push({ t: data.now, node: n.id, kind: "down", count: 1 });
      if (!was.probeUp && n.probeUp) events.push({ t: data.now, node: n.id, kind: "up", count: 1 });
    }
  }

  // ---- drawing ------------------------------------------------------------------------
  const W = 560, H = 210, M = { l: 52, r: 14, t: 12, b: 28 };

  function niceMax(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 4, 6, 8, 10]) if (m * p >= v) return m * p; // quarters stay round
    return 10 * p;
  }
  function fmt(v) {
    if (v === 0) return "0";
    if (Math.abs(v) >= 100) return Math.round(v).toString();
    if (Math.abs(v) >= 10) return (Math.round(v * 10) / 10).toString();
    return (Math.round(v * 100) / 100).toString();
  }
  function clock(t) {
    const d = new Date(t);
    return [d.getHours(), d.getMinutes(), d.getSeconds()].map((x) => String(x).padStart(2, "0")).join(":");
  }
  function domain(now) {
    const first = Math.min(samples.length ? samples[0].t : now, kept.length ? kept[0].t : now);
    const from = Math.max(now - VIEW_MS, Math.min(first, now - MIN_VIEW_MS));
    return [from, now];
  }

  /** x axis with clock ticks at round 30 s / 1 min steps, plus gridlines */
  function timeAxis(g, x, from, to, height) {
    const span = to - from;
    const step = span > 4 * 60000 ? 60000 : span > 90000 ? 30000 : 15000;
    for (let t = Math.ceil(from / step) * step; t <= to; t += step) {
      const px = x(t);
      g.append(svg("line", { x1: px, x2: px, y1: M.t, y2: height - M.b, class: "grid" }));
      g.append(svg("text", { x: px, y: height - M.b + 16, "text-anchor": "middle", class: "tick" }, clock(t)));
    }
  }

  /**
   * A line chart: one polyline per series (data-series, data-values for tests and tooltips),
   * y from 0 to a round maximum with its unit, ejections as dashed vertical lines.
   */
  function lineChart(id, spec) {
    const box = $(id);
    const [from, to] = domain(spec.now);
    const x = (t) => M.l + ((t - from) / (to - from)) * (W - M.l - M.r);
    const all = spec.series.flatMap((s) => s.points.map((p) => p[1]));
    const peak = Math.max(spec.minMax || 0, ...all);
    // counts get whole-number ticks (4 steps); rates and times a round maximum
    const top = spec.fixedMax || (spec.integer ? 4 * Math.ceil(peak / 4) : niceMax(peak));
    const y = (v) => H - M.b - (Math.min(v, top) / top) * (H - M.t - M.b);
    const root = svg("svg", { viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": spec.title, "data-chart": id.replace("chart-", "") });
    const g = svg("g");
    root.append(g);
    for (let i = 0; i <= 4; i++) {
      const v = (top * i) / 4, py = y(v);
      g.append(svg("line", { x1: M.l, x2: W - M.r, y1: py, y2: py, class: i === 0 ? "axis" : "grid" }));
      g.append(svg("text", { x: M.l - 6, y: py + 4, "text-anchor": "end", class: "tick" }, fmt(v) + (i === 4 ? " " + spec.unit : "")));
    }
    timeAxis(g, x, from, to, H);
    for (const e of events) {
      if (e.kind !== "eject" || e.t < from) continue;
      g.append(svg("line", { x1: x(e.t), x2: x(e.t), y1: M.t, y2: H - M.b, class: "eject-line", stroke: colour(e.node), "data-eject": e.node }));
    }
    let plotted = 0;
    for (const s of spec.series) {
      const pts = s.points.filter((p) => p[0] >= from);
      const line = svg("polyline", {
        points: pts.map((p) => x(p[0]).toFixed(1) + "," + y(p[1]).toFixed(1)).join(" "),
        fill: "none", stroke: s.colour, "stroke-width": s.width || 2, "stroke-linejoin": "round",
        "data-series": s.name, "data-values": JSON.stringify(pts.map((p) => Math.round(p[1] * 100) / 100)),
      });
      if (s.dash) line.setAttribute("stroke-dasharray", s.dash);
      plotted += pts.length;
      line.append(svg("title", {}, s.name + ": " + (pts.length ? fmt(pts[pts.length - 1][1]) + " " + spec.unit + " now" : "no data")));
      g.append(line);
      if (pts.length === 1) g.append(svg("circle", { cx: x(pts[0][0]), cy: y(pts[0][1]), r: 2.5, fill: s.colour }));
    }
    if (!plotted) g.append(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty" }, spec.empty || "waiting for data"));
    box.querySelector(".plot").replaceChildren(root);
    const legend = box.querySelector(".legend");
    legend.replaceChildren();
    for (const s of spec.series) {
      const last = s.points.length ? s.points[s.points.length - 1][1] : null;
      const item = el("span", null, { class: "key", "data-series": s.name });
      const sw = el("i", null, { class: "swatch" + (s.dash ? " dashed" : "") });
      sw.style.borderColor = s.colour;
      item.append(sw, el("span", s.name), el("b", last === null ? "-" : fmt(last) + " " + spec.unit));
      legend.append(item);
    }
  }

  /** The events strip: a row per node; bands while ejected or down, dots for failures, triangles for ejections. */
  function eventChart(nodes, now) {
    // twice as wide as a line chart (it spans the grid), so its text renders at the same size
    const EW = 2 * W + 40, rowH = 22, h = M.t + nodes.length * rowH + M.b;
    const [from, to] = domain(now);
    const x = (t) => M.l + ((Math.max(t, from) - from) / (to - from)) * (EW - M.l - M.r);
    const root = svg("svg", { viewBox: "0 0 " + EW + " " + h, role: "img", "aria-label": "failures and ejections", "data-chart": "events" });
    timeAxis(root, x, from, to, h);
    nodes.forEach((n, i) => {
      const cy = M.t + i * rowH + rowH / 2;
      root.append(svg("text", { x: M.l - 6, y: cy + 4, "text-anchor": "end", class: "tick" }, n.id));
      root.append(svg("line", { x1: M.l, x2: EW - M.r, y1: cy, y2: cy, class: "grid" }));
      // bands from the samples: ejected (breaker open) or probes down
      for (const [kind, test] of [["down", (m) => !m.probeUp], ["ejected", (m) => m.breaker === "open"]]) {
        let start = null;
        for (let k = 0; k <= samples.length; k++) {
          const s = samples[k];
          const m = s && s.data.nodes.find((o) => o.id === n.id);
          const on = !!m && test(m);
          if (on && start === null) start = s.t;
          if (!on && start !== null) {
            const end = s ? s.t : now;
            if (end >= from) root.append(svg("rect", { x: x(start), y: cy - 7, width: Math.max(2, x(end) - x(start)), height: 14, class: "band " + kind, "data-band": kind, "data-node": n.id }));
            start = null;
          }
        }
      }
      for (const e of events) {
        if (e.node !== n.id || e.t < from) continue;
        const ex = x(e.t);
        let mark;
        if (e.kind === "failure") mark = svg("circle", { cx: ex, cy, r: Math.min(7, 3 + e.count), fill: colour(n.id), class: "mark" });
        else if (e.kind === "eject") mark = svg("path", { d: "M" + (ex - 6) + "," + (cy - 9) + " h12 l-6,10 z", class: "mark eject" });
        else if (e.kind === "down") mark = svg("path", { d: "M" + ex + "," + (cy + 8) + " v-16", class: "mark down" });
        else mark = svg("path", { d: "M" + ex + "," + (cy + 8) + " v-16", class: "mark up" });
        mark.setAttribute("data-kind", e.kind);
        mark.setAttribute("data-node", e.node);
        mark.append(svg("title", {}, n.id + ": " + (e.kind === "failure" ? e.count + " failure" + (e.count > 1 ? "s" : "") : e.kind === "eject" ? "ejected" : e.kind === "down" ? "probes down" : "probes up") + " at " + clock(e.t)));
        root.append(mark);
      }
    });
    $("chart-events").querySelector(".plot").replaceChildren(root);
  }

  function drawCharts(data) {
    const nodes = data.nodes;
    const s = series(nodes);
    const perNode = (m) => nodes.map((n) => ({ name: n.id, colour: colour(n.id), points: m.get(n.id) }));
    lineChart("chart-rps", { title: "requests per second", unit: "req/s", now: data.now, minMax: 1,
      series: [...perNode(s.rps), { name: "routed (router)", colour: "#1f2937", dash: "5 4", width: 1.5, points: s.total }] });
    lineChart("chart-inflight", { title: "requests in flight", unit: "", now: data.now, minMax: 4, integer: true, series: perNode(s.inflight) });
    const decoders = nodes.filter((n) => n.roles.includes("decode"));
    lineChart("chart-kv", { title: "KV cache use", unit: "%", now: data.now, fixedMax: 100, empty: "no engine has answered a /metrics poll yet",
      series: decoders.map((n) => ({ name: n.id, colour: colour(n.id), points: s.kv.get(n.id) })) });
    lineChart("chart-ttfb", { title: "decode time to first byte", unit: "ms", now: data.now, minMax: 10, empty: "no decode legs finished in the last 10 s",
      series: [{ name: "p50", colour: "#0f766e", points: s.p50 }, { name: "p99", colour: "#b45309", dash: "6 4", points: s.p99 }] });
    const policy = data.config.policy;
    const cacheAware = !!policy && (policy.prefill === "cache_aware" || policy.decode === "cache_aware");
    $("chart-hit").hidden = !cacheAware;
    $("hit-off").hidden = cacheAware;
    if (cacheAware) lineChart("chart-hit", { title: "prefix hit ratio", unit: "%", now: data.now, fixedMax: 100, empty: "no prefix lookups in the last 10 s",
      series: [{ name: "matched / looked-up blocks", colour: "#7c3aed", points: s.hit }] });
    else $("hit-off").textContent = "Prefix hit ratio: shown when a role routes with cache_aware (this cluster: " + (policy ? policy.prefill + "/" + policy.decode : "no valid document") + ").";
    eventChart(nodes, data.now);
  }

  // ---- tables -------------------------------------------------------------------------
  function render(data) {
    $("login").hidden = true;
    $("dashboard").hidden = false;
    const cfg = data.config;
    $("config").textContent = (cfg.valid ? "document valid" : "document INVALID: " + cfg.problems.map((p) => p.path + ": " + p.message).join("; ")) +
      " | protocol " + (cfg.protocol || "-") + " | policy " + (cfg.policy ? cfg.policy.prefill + "/" + cfg.policy.decode + ", pdGroup " + cfg.policy.pdGroup : "-");
    $("config").className = cfg.valid ? "" : "bad";
    $("warnings").replaceChildren(...(data.warnings || []).map((w) => el("li", w)));
    noteEvents(data, previous);
    if (Array.isArray(data.history)) kept = data.history;
    samples.push({ t: data.now, data });
    while (samples.length && samples[0].t < data.now - KEEP_MS) samples.shift();
    while (events.length && events[0].t < data.now - KEEP_MS) events.shift();
    drawCharts(data);
    const dt = previous ? Math.max(0.001, (data.now - previous.now) / 1000) : null;
    const before = new Map((previous ? previous.nodes : []).map((n) => [n.id, n]));
    const rows = $("nodes");
    rows.replaceChildren();
    for (const n of data.nodes) {
      const [label, cls] = health(n);
      const total = nodeTotal(n);
      const old = before.get(n.id);
      const rate = dt && old ? ((total - nodeTotal(old)) / dt).toFixed(1) + "/s" : "-";
      const tr = el("tr", null, { "data-node": n.id, "data-health": label });
      const name = el("td", null);
      const dot = el("i", null, { class: "dot" });
      dot.style.background = colour(n.id);
      name.append(dot, document.createTextNode(n.id));
      tr.append(name, el("td", n.roles.join("+")), el("td", n.group || "-"));
      const h = el("td", label, { class: "health " + cls });
      const sig = n.signals;
      const kvText = sig && sig.kvUsage !== null ? Math.round(100 * sig.kvUsage) + "%" + (sig.projected ? "" : " (stale)") : "-";
      const kvCell = el("td", kvText, { class: sig && sig.busy ? "bad" : "" });
      tr.append(h, el("td", n.breaker.replace("_", "-")), el("td", n.inflight.prefill + n.inflight.decode), el("td", total), el("td", rate), el("td", n.failuresTotal), kvCell, el("td", sig && sig.waiting !== null ? sig.waiting : "-"));
      rows.append(tr);
    }
    const mix = $("mix");
    mix.replaceChildren();
    const sum = data.decisions.reduce((s, d) => s + d.count, 0);
    for (const d of data.decisions.slice().sort((a, b) => b.count - a.count)) {
      const tr = el("tr");
      tr.append(el("td", d.role), el("td", d.rule), el("td", d.count), el("td", sum ? Math.round((100 * d.count) / sum) + "%" : "-"));
      mix.append(tr);
    }
    if (!data.decisions.length) mix.append(el("tr")).append(el("td", "no routed requests yet", { colspan: 4 }));
    $("updated").textContent = "updated " + new Date(data.now).toLocaleTimeString();
    previous = data;
  }

  async function refresh() {
    clearTimeout(timer);
    const token = sessionStorage.getItem(KEY);
    if (!isPublic && !token) return showLogin("");
    try {
      const res = await fetch("/status.json", { headers: token ? { authorization: "Bearer " + token } : {}, cache: "no-store" });
      if (res.status === 401) {
        sessionStorage.removeItem(KEY);
        return showLogin("That token was not accepted.");
      }
      if (!res.ok) throw new Error("status " + res.status);
      render(await res.json());
      $("error").textContent = "";
    } catch (err) {
      $("error").textContent = "refresh failed: " + err.message;
    }
    timer = setTimeout(refresh, POLL_MS);
  }

  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY, $("token").value.trim());
    $("token").value = "";
    refresh();
  });
  $("logout").addEventListener("click", () => {
    sessionStorage.removeItem(KEY);
    clearTimeout(timer);
    showLogin("");
  });
  if (isPublic) $("logout").hidden = true;
  refresh();
})();
`;

const STYLE = `
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5rem; color: #1d2330; background: #f6f7f9; }
h1 { font-size: 1.3rem; margin: 0 0 .5rem; } h2 { font-size: 1rem; margin: 1.5rem 0 .4rem; }
table { border-collapse: collapse; background: #fff; min-width: 40rem; }
th, td { padding: .3rem .7rem; border-bottom: 1px solid #e3e6eb; text-align: left; }
th { background: #eef0f4; font-weight: 600; }
.good { color: #0a7a33; font-weight: 600; } .warn { color: #a66300; font-weight: 600; } .bad { color: #b3141b; font-weight: 600; }
#meta { color: #5b6472; } #error { color: #b3141b; }
form { display: flex; gap: .5rem; } input { padding: .3rem; min-width: 20rem; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(30rem, 1fr)); gap: 1rem; max-width: 80rem; }
.chart { background: #fff; border: 1px solid #e3e6eb; border-radius: 6px; padding: .6rem .8rem .4rem; }
.chart.wide { grid-column: 1 / -1; }
.chart h3 { font-size: .9rem; margin: 0 0 .2rem; font-weight: 600; } .chart h3 small { color: #5b6472; font-weight: 400; }
.chart svg { width: 100%; height: auto; display: block; }
.legend { display: flex; flex-wrap: wrap; gap: .3rem 1rem; font-size: .8rem; color: #374151; margin-top: .2rem; }
.key { display: inline-flex; align-items: center; gap: .3rem; } .key b { font-weight: 600; font-variant-numeric: tabular-nums; }
.swatch { display: inline-block; width: 1.2rem; border-top: 3px solid; } .swatch.dashed { border-top-style: dashed; }
.dot { display: inline-block; width: .6rem; height: .6rem; border-radius: 50%; margin-right: .4rem; }
svg .grid { stroke: #eef0f4; } svg .axis { stroke: #9aa3af; }
svg .tick { font-size: 10px; fill: #6b7280; font-variant-numeric: tabular-nums; } svg .empty { font-size: 12px; fill: #9aa3af; }
svg .eject-line { stroke-width: 1.2; stroke-dasharray: 3 3; opacity: .8; }
svg .band.ejected { fill: #fecaca; } svg .band.down { fill: #e5e7eb; }
svg .mark { stroke: #fff; stroke-width: 1; } svg .mark.eject { fill: #b3141b; }
svg .mark.down { stroke: #4b5563; stroke-width: 2.5; } svg .mark.up { stroke: #16a34a; stroke-width: 2.5; }
#hit-off { color: #5b6472; font-size: .85rem; }
`;

let scriptHash: Promise<string> | null = null;

/** CSP hash of the inline script, so the page runs no script but its own. */
function hashScript(): Promise<string> {
  scriptHash ??= crypto.subtle.digest("SHA-256", new TextEncoder().encode(SCRIPT)).then((d) => btoa(String.fromCharCode(...new Uint8Array(d))));
  return scriptHash;
}

const chart = (id: string, title: string, note: string, wide = false) =>
  `<div class="chart${wide ? " wide" : ""}" id="${id}"><h3>${title} <small>${note}</small></h3><div class="plot"></div><div class="legend"></div></div>`;

export async function statusPage({ isPublic }: { isPublic: boolean }): Promise<{ html: string; headers: Record<string, string> }> {
  const html = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>pd-edge-router status</title><style>${STYLE}</style></head>
<body data-public="${isPublic ? "true" : "false"}">
<h1>pd-edge-router</h1>
<section id="login" hidden>
  <p>Enter the admin token (kept in this tab's session storage only).</p>
  <form id="login-form"><input id="token" type="password" autocomplete="off" placeholder="ADMIN_TOKEN" aria-label="admin token"><button type="submit">Show status</button></form>
  <p id="login-message" class="bad"></p>
</section>
<section id="dashboard" hidden>
  <p id="meta"><span id="config"></span> | <span id="updated"></span> <button id="logout" type="button">forget token</button></p>
  <p id="error"></p>
  <ul id="warnings" class="warn"></ul>
  <h2>Last 15 minutes <small>(in flight and KV use from the router's own history; rates since this tab opened; refreshed every 2 s)</small></h2>
  <div class="charts">
    ${chart("chart-rps", "Requests per second", "per node (a request counts on its P and its D), and routed by the router")}
    ${chart("chart-inflight", "In flight", "per node: prefill legs running plus decode streams open")}
    ${chart("chart-kv", "KV cache use", "per decode node, as its engine reports on /metrics (polled every signals.intervalMs)")}
    ${chart("chart-ttfb", "Decode TTFB", "p50 and p99 over the last 10 s, from the router's histogram")}
    ${chart("chart-hit", "Prefix hit ratio", "cache_aware: blocks the chosen node held, last 10 s")}
    <p id="hit-off" hidden></p>
    ${chart("chart-events", "Failures and ejections", "dots: failed legs; red triangles and bands: ejected; grey bands: probes down", true)}
  </div>
  <h2>Nodes</h2>
  <table><thead><tr><th>node</th><th>role</th><th>group</th><th>health</th><th>breaker</th><th>in flight</th><th>requests</th><th>rate</th><th>failures</th><th>KV use</th><th>engine queue</th></tr></thead><tbody id="nodes"></tbody></table>
  <h2>Routing mix (decisions by rule)</h2>
  <table><thead><tr><th>role</th><th>rule</th><th>decisions</th><th>share</th></tr></thead><tbody id="mix"></tbody></table>
</section>
<script>${SCRIPT}</script>
</body></html>`;
  return {
    html,
    headers: {
      "content-type": "text/html; charset=utf-8",
      "cache-control": "no-store",
      "content-security-policy": `default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-${await hashScript()}'; connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'`,
      "x-content-type-options": "nosniff",
      "referrer-policy": "no-referrer",
      "x-frame-options": "DENY",
    },
  };
}
