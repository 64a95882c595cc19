// Requests that failed inside a proxy, counted by kind: the status and the first words of the
// error, so "500 The Workers runtime canceled this request ... hung" and a broken stream are
// told apart in the report (issue 12).

/** Known messages, shortened to a stable label. */
const KNOWN = [
  { re: /detected that your Worker's code had hung/i, label: 'runtime canceled: code had hung' },
  { re: /exceeded (its )?CPU/i, label: 'runtime canceled: CPU limit' },
  { re: /exceeded (its )?memory/i, label: 'runtime canceled: memory limit' },
  { re: /restarted mid-request/i, label: 'dev proxy: worker restarted mid-request' },
  { re: /response ended early/i, label: 'response ended early' },
];

/**
 * The kind of a failed request, or null when it succeeded (2xx and, for a stream, a clean end).
 * @param {{ status: number, error?: string, json?: any }} r a PostResult (bench/lib/http-client.mjs)
 * @returns {string | null}
 */
export function failureKind(r) {
  const ok = r.status >= 200 && r.status < 300;
  if (ok && !r.error) return null;
  const json = r.json;
  const fromJson = typeof json?.error === 'string' ? json.error : (json?.error?.code ?? json?.error?.message ?? undefined);
  const text = String(r.error ?? fromJson ?? '').replace(/^non-JSON answer: /, '');
  const known = KNOWN.find((k) => k.re.test(text));
  const detail = known ? known.label : shorten(text);
  if (r.status === 0) return `transport: ${detail || 'no answer'}`;
  if (ok) return `${r.status} broken stream: ${detail}`;
  return `${r.status}${detail ? ` ${detail}` : ''}`;
}

/** First sentence, numbers masked (ids, ports, ms), at most 80 characters. @param {string} text */
function shorten(text) {
  const first = text.split(/(?<=[.!?])\s/)[0] ?? '';
  const masked = first.replace(/\d+/g, 'N').replace(/\s+/g, ' ').trim();
  return masked.length > 80 ? `${masked.slice(0, 77)}...` : masked;
}

/**
 * Failures by kind, most frequent first.
 * @param {(string | null)[]} kinds failureKind of each request
 * @returns {{ kind: string, count: number }[]}
 */
export function countKinds(kinds) {
  /** @type {Map<string, number>} */
  const counts = new Map();
  for (const k of kinds) if (k !== null) counts.set(k, (counts.get(k) ?? 0) + 1);
  return [...counts].map(([kind, count]) => ({ kind, count })).sort((a, b) => b.count - a.count || a.kind.localeCompare(b.kind));
}
