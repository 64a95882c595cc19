import { SELF } from "cloudflare:test";

// The secrets of the worker-secured project (vitest.config.ts).
export const ADMIN = "ops-admin-token";
export const KEY = "ops-key-main";
export const ALT_KEY = "ops-key-alt";
export const LIMITED_KEY = "ops-key-limited";
export const METRICS = "ops-metrics-token";

export const bearer = (token: string) => ({ authorization: `Bearer ${token}` });

export function call(path: string, init: RequestInit & { headers?: Record<string, string> } = {}) {
  return SELF.fetch(`http://router${path}`, init);
}

export const admin = (path: string, init: RequestInit & { headers?: Record<string, string> } = {}) =>
  call(path, { ...init, headers: { ...bearer(ADMIN), ...(init.headers ?? {}) } });

export async function metricsText(): Promise<string> {
  const res = await call("/metrics", { headers: bearer(METRICS) });
  if (res.status !== 200) throw new Error(`metrics: ${res.status} ${await res.text()}`);
  return res.text();
}

/** The value of one exact series line (`name{labels}`), or null when absent. */
export function seriesValue(text: string, series: string): number | null {
  const line = text.split("\n").find((l) => l.startsWith(series + " "));
  return line === undefined ? null : Number(line.slice(series.length + 1));
}

/** Polls until `check` passes (background counters are written in waitUntil). */
export async function eventually<T>(check: () => Promise<T>, timeoutMs = 3000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      return await check();
    } catch (err) {
      if (Date.now() > deadline) throw err;
      await new Promise((r) => setTimeout(r, 25));
    }
  }
}
