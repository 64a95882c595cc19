/**
 * Counts a stream's SSE data events as they pass and when the first and last came. One look at
 * each byte, no decoding. An event may carry several tokens (an engine's --stream-interval): the
 * tokens are what a usage frame in the stream reported, set by its reader (node-rates.ts).
 */
export function streamPace(): { events: number; first: number; last: number; tokens: number | undefined; watch(bytes: Uint8Array): void } {
  // "data:" at the start of a line; `atLineStart` carries across chunks
  const DATA = [0x64, 0x61, 0x74, 0x61, 0x3a];
  let atLineStart = true;
  let matched = -1;
  const pace = {
    events: 0,
    first: 0,
    last: 0,
    tokens: undefined as number | undefined,
    watch(bytes: Uint8Array) {
      let found = false;
      for (const b of bytes) {
        if (b === 0x0a) {
          atLineStart = true;
          matched = -1;
          continue;
        }
        if (atLineStart) {
          matched = 0;
          atLineStart = false;
        }
        if (matched >= 0 && b === DATA[matched]) {
          matched++;
          if (matched === DATA.length) {
            pace.events++;
            found = true;
            matched = -1;
          }
        } else matched = -1;
      }
      if (!found) return;
      const now = Date.now();
      if (pace.first === 0) pace.first = now;
      pace.last = now;
    },
  };
  return pace;
}
