import type { NodeReach } from "./schema";

// How the router reaches a node. Every request to a node — P and D legs, handle releases,
// Mooncake's bootstrap /query, health probes, /v1/models, /metrics polls — goes through
// `nodeAccess(env, node).fetch`, so a node behind a Workers VPC binding or Cloudflare Access is
// reached the same way by all of them.
//
// Workers VPC (developers.cloudflare.com/workers-vpc/api/, cloudflare/cloudflare-docs
// src/content/docs/workers-vpc/configuration/vpc-networks/index.mdx and vpc-services/index.mdx):
// a `vpc_networks` binding's `fetch(url)` goes to whatever private host and port the URL names
// through the bound Tunnel or Cloudflare Mesh; a `vpc_services` binding always goes to the one
// host and port its service was registered with (the URL's host only sets Host/SNI). Both take
// an absolute URL and throw when the tunnel cannot connect.
// Access service tokens (cloudflare-docs src/content/docs/cloudflare-one/identity/service-tokens.mdx):
// `CF-Access-Client-Id` and `CF-Access-Client-Secret` on every request.

/** A node as far as reaching it goes. */
export interface ReachableNode {
  id: string;
  reach: NodeReach;
  /** name of the NODE_* secret holding its bearer token */
  apiKeySecret?: string | undefined;
}

/** How requests to one node are sent, resolved against the Worker's bindings and secrets. */
export interface NodeAccess {
  /** sends a request to the node: through its VPC binding, or the runtime's fetch */
  fetch(url: URL, init: RequestInit): Promise<Response>;
  /** the binding it goes through (null: directly) */
  via: string | null;
  /** headers every request to the node carries: its bearer token, its Access service token */
  headers: Readonly<Record<string, string>>;
  /** every credential value the node's requests carry (bearer token, Access client id and secret), so an answer that echoes one can be scrubbed */
  secrets: readonly string[];
}

/** The headers that only a node naming an Access service token gets. */
export const ACCESS_ID_HEADER = "cf-access-client-id";
export const ACCESS_SECRET_HEADER = "cf-access-client-secret";

type Fetch = (url: URL, init: RequestInit) => Promise<Response>;

const secretOf = (env: Record<string, unknown>, name: string | undefined): string | null => {
  const value = name ? env[name] : undefined;
  return typeof value === "string" && value !== "" ? value : null;
};

/** A binding that can carry a request (a VPC network or service, or a service binding standing in for one). */
function fetcherOf(env: Record<string, unknown>, name: string): Fetch | null {
  const binding = env[name] as { fetch?: unknown } | undefined;
  if (!binding || typeof binding !== "object" || typeof binding.fetch !== "function") return null;
  const fetcher = binding as { fetch(input: Request | string | URL, init?: RequestInit): Promise<Response> };
  return (url, init) => fetcher.fetch(url, init);
}

/** Fails every request with `message`: the node is misconfigured, and its legs and probes say how. */
const failing =
  (message: string): Fetch =>
  () =>
    Promise.reject(new Error(message));

/**
 * How to reach `node` with this Worker's env: its binding (only a VPC_* name the document was
 * allowed to give), its bearer token, its Access service token. A binding or Access secret that
 * is named but missing makes every request to the node fail with a message saying so, rather
 * than go out over the public internet or without credentials.
 */
export function nodeAccess(env: Record<string, unknown>, node: ReachableNode, direct: Fetch = (url, init) => fetch(url, init)): NodeAccess {
  const headers: Record<string, string> = {};
  const token = secretOf(env, node.apiKeySecret);
  if (token) headers.authorization = `Bearer ${token}`;
  const problems: string[] = [];
  const access = node.reach.access;
  if (access) {
    const id = secretOf(env, access.clientId);
    const secret = secretOf(env, access.clientSecret);
    if (id && secret) {
      headers[ACCESS_ID_HEADER] = id;
      headers[ACCESS_SECRET_HEADER] = secret;
    } else {
      const missing = [id ? null : access.clientId, secret ? null : access.clientSecret].filter(Boolean).join(" and ");
      problems.push(`its Access service token secret ${missing} is not set`);
    }
  }
  const via = node.reach.binding ?? null;
  let send = direct;
  if (via) {
    const bound = fetcherOf(env, via);
    if (bound) send = bound;
    else problems.push(`its binding ${via} is not bound to this Worker`);
  }
  if (problems.length) send = failing(`node ${node.id} cannot be reached: ${problems.join("; ")}`);
  // what the node is told and must never be repeated to a client or a log line
  const secrets = Object.values(headers).flatMap((v) => [v, v.replace(/^Bearer /, "")]);
  return { fetch: send, via, headers, secrets };
}

/** A GET of `path` on the node (probes, /v1/models, /metrics): the node's headers, no redirect followed. */
export function nodeGet(access: NodeAccess, origin: string, path: string, signal: AbortSignal): Promise<Response> {
  return access.fetch(new URL(path, origin), { headers: { ...access.headers }, redirect: "manual", signal });
}
