// The operators' status page: one self-contained HTML document (inline CSS and JS, no
// framework). It carries no data itself; its script polls /status.json every 2 s with the
// admin token kept in sessionStorage (sent as a bearer header, never in a URL).

const SCRIPT = `
(() => {
  const KEY = "pd-router-admin-token";
  const isPublic = document.body.dataset.public === "true";
  const $ = (id) => document.getElementById(id);
  let previous = null;
  let timer = null;

  function el(tag, text, attrs) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    return node;
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

  function render(data) {
    $("login").hidden = true;
    $("dashboard").hidden = false;
    const cfg = data.config;
    $("config").textContent = (cfg.valid ? "document valid" : "document INVALID: " + cfg.problems.map((p) => p.path + ": " + p.message).join("; ")) +
      " | protocol " + (cfg.protocol || "-") + " | policy " + (cfg.policy ? cfg.policy.prefill + "/" + cfg.policy.decode + ", pdGroup " + cfg.policy.pdGroup : "-");
    $("config").className = cfg.valid ? "" : "bad";
    const dt = previous ? Math.max(0.001, (data.now - previous.now) / 1000) : null;
    const before = new Map((previous ? previous.nodes : []).map((n) => [n.id, n]));
    const rows = $("nodes");
    rows.replaceChildren();
    for (const n of data.nodes) {
      const [label, cls] = health(n);
      const total = n.requestsTotal.prefill + n.requestsTotal.decode;
      const old = before.get(n.id);
      const rate = dt && old ? ((total - old.requestsTotal.prefill - old.requestsTotal.decode) / dt).toFixed(1) + "/s" : "-";
      const tr = el("tr", null, { "data-node": n.id, "data-health": label });
      tr.append(el("td", n.id), el("td", n.roles.join("+")), el("td", n.group || "-"));
      const h = el("td", label, { class: "health " + cls });
      tr.append(h, el("td", n.breaker.replace("_", "-")), el("td", n.inflight.prefill + n.inflight.decode), el("td", total), el("td", rate), el("td", n.failuresTotal));
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
    timer = setTimeout(refresh, 2000);
  }

  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY, $("token").value.trim());
    $("token").value = "";
    refresh();
  });
  $("logout").addEventListener("click", () => {
    sessionStorage.removeItem(KEY);
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
`;

let scriptHash: Promise<string> | null = null;

/** CSP hash of the inline script, so the page runs no script but its own. */
function hashScript(): Promise<string> {
  scriptHash ??= crypto.subtle.digest("SHA-256", new TextEncoder().encode(SCRIPT)).then((d) => btoa(String.fromCharCode(...new Uint8Array(d))));
  return scriptHash;
}

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
  <h2>Nodes</h2>
  <table><thead><tr><th>node</th><th>role</th><th>group</th><th>health</th><th>breaker</th><th>in flight</th><th>requests</th><th>rate</th><th>failures</th></tr></thead><tbody id="nodes"></tbody></table>
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
