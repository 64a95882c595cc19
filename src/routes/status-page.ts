import { RouterError } from "../errors";

// The operators' status page: assets/status.html, one self-contained HTML document (inline CSS
// and JS, no framework, no external assets; what it does is described at its top). It is a
// static asset (wrangler.toml [assets]), not part of the Worker's code: a cold start does not
// load its 25 KB (docs/operations.md, "Bundle size"). The Worker alone decides who gets it (status.ts), reads
// it through the ASSETS binding and sends it with a strict CSP that allows its own script only.

const PAGE = "/status.html";

/** The page and its script's CSP hash, once read: data shared by requests, never a pending read. */
let loaded: { html: string; scriptHash: string } | null = null;

async function loadPage(assets: Fetcher | undefined): Promise<{ html: string; scriptHash: string }> {
  if (loaded) return loaded;
  const res = await assets?.fetch(`https://assets.invalid${PAGE}`);
  if (!res?.ok) {
    throw new RouterError(500, `The status page is missing: no ASSETS binding serves assets${PAGE}.`, "server_error", "status_page_missing");
  }
  const html = await res.text();
  const script = html.slice(html.indexOf("<script>") + "<script>".length, html.lastIndexOf("</script>"));
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(script));
  loaded = { html, scriptHash: btoa(String.fromCharCode(...new Uint8Array(digest))) };
  return loaded;
}

export async function statusPage({ isPublic, assets }: { isPublic: boolean; assets: Fetcher | undefined }): Promise<{ html: string; headers: Record<string, string> }> {
  const { html, scriptHash } = await loadPage(assets);
  return {
    // the page hides its "forget token" button when anyone may read the status
    html: isPublic ? html.replace('<body data-public="false">', '<body data-public="true">') : html,
    headers: {
      "content-type": "text/html; charset=utf-8",
      "cache-control": "no-store",
      "content-security-policy": `default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-${scriptHash}'; connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'`,
      "x-content-type-options": "nosniff",
      "referrer-policy": "no-referrer",
      "x-frame-options": "DENY",
    },
  };
}
