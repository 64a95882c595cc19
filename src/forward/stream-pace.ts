/**
 * Counts a stream's SSE data events as they pass and when the first and last came: a line's first
 * bytes are looked at, the rest skipped with `indexOf`; no decoding. An event may carry several
 * tokens (an engine's --stream-interval): the tokens are what a usage frame in the stream
 * reported, set by its reader (node-rates.ts).
 */
export function streamPace(): { events: number; first: number; last: number; tokens: number | undefined; watch(bytes: Uint8Array): void } {
  // "data:" at the start of a line; `atLineStart` carries across chunks
  const DATA = [0x64, 0x61, 0x74, 0x61, 0x3a];
  const LF = 0x0a;
  let atLineStart = true;
  let matched = -1;
  const pace = {
    events: 0,
    first: 0,
    last: 0,
    tokens: undefined as number | undefined,
    watch(bytes: Uint8Array) {
      let found = false;
      const n = bytes.length;
      let i = 0;
      while (i < n) {
        if (atLineStart) {
          atLineStart = false;
          matched = 0;
        }
        // a line's first bytes, against "data:" (a match may straddle two chunks)
        while (matched >= 0 && i < n && bytes[i] !== LF) {
          if (bytes[i++] !== DATA[matched]) matched = -1;
          else if (++matched === DATA.length) {
            pace.events++;
            found = true;
            matched = -1;
          }
        }
        // the rest of the line is skipped natively (one indexOf a line, not a JS step a byte)
        const lf = bytes.indexOf(LF, i);
        if (lf < 0) break;
        atLineStart = true;
        matched = -1;
        i = lf + 1;
      }
      if (!found) return;
      const now = Date.now();
      if (pace.first === 0) pace.first = now;
      pace.last = now;
    },
  };
  return pace;
}
