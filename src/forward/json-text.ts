// Edits the top level of a JSON object as text. The client's bytes reach the nodes unchanged
// except for the members a protocol must drop or set, and P's kv_transfer_params reach D as P
// wrote them: numbers beyond 2^53 (seeds, engine ids, rooms) never pass through a JS number.

/** One top-level member: `text.slice(start, end)` is `"key": value`, `text.slice(valueStart, end)` the value. */
export interface MemberSpan {
  key: string;
  start: number;
  valueStart: number;
  end: number;
}

const WS = new Set([0x20, 0x09, 0x0a, 0x0d]);

function skipWs(text: string, i: number): number {
  while (i < text.length && WS.has(text.charCodeAt(i))) i++;
  return i;
}

/** Index just past the string that starts at `i` (a `"`). */
function skipString(text: string, i: number): number {
  for (let j = i + 1; j < text.length; j++) {
    const c = text.charCodeAt(j);
    if (c === 0x5c) j++;
    else if (c === 0x22) return j + 1;
  }
  throw new SyntaxError("unterminated string");
}

/** Index just past the value that starts at `i`. */
function skipValue(text: string, i: number): number {
  const first = text.charCodeAt(i);
  if (first === 0x22) return skipString(text, i);
  if (first === 0x7b || first === 0x5b) {
    let depth = 0;
    for (let j = i; j < text.length; j++) {
      const c = text.charCodeAt(j);
      if (c === 0x22) j = skipString(text, j) - 1;
      else if (c === 0x7b || c === 0x5b) depth++;
      else if (c === 0x7d || c === 0x5d) {
        depth--;
        if (depth === 0) return j + 1;
      }
    }
    throw new SyntaxError("unterminated value");
  }
  let j = i;
  while (j < text.length) {
    const c = text.charCodeAt(j);
    if (c === 0x2c || c === 0x7d || c === 0x5d || WS.has(c)) break;
    j++;
  }
  if (j === i) throw new SyntaxError("missing value");
  return j;
}

/**
 * The top-level members of a JSON object text, in order. The text must already be known to be
 * valid JSON (it was parsed once at the edge); this only finds where each member is.
 */
export function topLevelMembers(text: string): MemberSpan[] {
  const members: MemberSpan[] = [];
  let i = skipWs(text, 0);
  if (text.charCodeAt(i) !== 0x7b) throw new SyntaxError("not a JSON object");
  i = skipWs(text, i + 1);
  if (text.charCodeAt(i) === 0x7d) return members;
  for (;;) {
    const start = i;
    const keyEnd = skipString(text, i);
    const key = JSON.parse(text.slice(i, keyEnd)) as string;
    i = skipWs(text, keyEnd);
    if (text.charCodeAt(i) !== 0x3a) throw new SyntaxError("expected ':'");
    const valueStart = skipWs(text, i + 1);
    const end = skipValue(text, valueStart);
    members.push({ key, start, valueStart, end });
    i = skipWs(text, end);
    const c = text.charCodeAt(i);
    if (c === 0x7d) return members;
    if (c !== 0x2c) throw new SyntaxError("expected ',' or '}'");
    i = skipWs(text, i + 1);
  }
}

/** The raw text of a top-level member's value, or undefined when absent (or the text is not an object). */
export function memberText(text: string, key: string): string | undefined {
  try {
    const m = topLevelMembers(text).find((s) => s.key === key);
    return m ? text.slice(m.valueStart, m.end) : undefined;
  } catch {
    return undefined;
  }
}

/**
 * The object with the members named in `drop` and `set` removed, then `set` appended (each
 * value raw JSON text). Every other member is copied byte for byte. The last occurrence of a
 * duplicated key wins in JSON.parse, so removing by name removes every occurrence.
 */
export function editMembers(text: string, set: Record<string, string>, drop: readonly string[] = []): string {
  const removed = new Set([...drop, ...Object.keys(set)]);
  // Fast path (the usual body): no member to remove can be in it, since its name appears nowhere
  // as a JSON string (and no \u escape could spell it otherwise) — append the new members before
  // the closing brace, without a scan.
  if (!text.includes("\\u") && ![...removed].some((k) => text.includes(JSON.stringify(k)))) {
    const additions = Object.entries(set).map(([k, v]) => `${JSON.stringify(k)}:${v}`);
    if (additions.length === 0) return text;
    const end = text.lastIndexOf("}");
    const inner = text.slice(0, end).trimEnd();
    return `${inner}${inner.endsWith("{") ? "" : ","}${additions.join(",")}}`;
  }
  const members = topLevelMembers(text);
  // nothing to change (a one-hop body without router-owned fields): the client's bytes as they are
  if (Object.keys(set).length === 0 && !members.some((m) => removed.has(m.key))) return text;
  const kept = members.filter((m) => !removed.has(m.key)).map((m) => text.slice(m.start, m.end));
  for (const [k, v] of Object.entries(set)) kept.push(`${JSON.stringify(k)}:${v}`);
  return `{${kept.join(",")}}`;
}
