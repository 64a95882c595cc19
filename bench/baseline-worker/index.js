// The minimal pass-through a P/D router is measured against (issue 12): the same two vllm legs
// as the router (SPEC 4), with plain `fetch`, no Durable Object, no KV, no parsing beyond the
// one JSON.parse the prefill body needs. P and D alternate by an isolate-local counter.
//   P_URLS, D_URLS: comma-separated origins (bindings)

let next = 0;

export default {
  /** @param {Request} request @param {{ P_URLS: string, D_URLS: string }} env */
  async fetch(request, env) {
    const url = new URL(request.url);
    if (url.pathname === "/healthz") return new Response("ok");
    const body = await request.json();
    const ps = env.P_URLS.split(",");
    const ds = env.D_URLS.split(",");
    const i = next++;
    const headers = { "content-type": "application/json", "x-request-id": request.headers.get("x-request-id") ?? "" };
    const prefillBody = {
      ...body,
      stream: false,
      max_tokens: 1,
      kv_transfer_params: { do_remote_decode: true, do_remote_prefill: false, remote_engine_id: null, remote_block_ids: null, remote_host: null, remote_port: null },
    };
    delete prefillBody.stream_options;
    const p = await fetch(ps[i % ps.length] + url.pathname, { method: "POST", headers, body: JSON.stringify(prefillBody), signal: request.signal });
    if (!p.ok) return new Response(p.body, { status: p.status, headers: p.headers });
    const { kv_transfer_params } = await p.json();
    const d = await fetch(ds[(i >> 1) % ds.length] + url.pathname, { method: "POST", headers, body: JSON.stringify({ ...body, kv_transfer_params }), signal: request.signal });
    return new Response(d.body, { status: d.status, headers: d.headers });
  },
};
