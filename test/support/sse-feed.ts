import type { EngineError } from "../../src/forward/engine-error";
import { sseReader, type Completeness, type DataRewrite } from "../../src/forward/sse-reader";

/** What one SseReader made of a stream fed in pieces. */
export interface Fed {
  /** every byte it passed, joined */
  bytes: Uint8Array;
  out: string;
  error: EngineError | null;
  /** how many times an error was reported (once at most) */
  errors: number;
  complete: boolean;
  settled: boolean;
  tooLong: boolean;
}

const enc = new TextEncoder();

/** Feeds `input` to a fresh reader in the pieces `cuts` make (positions in bytes), then `end` unless told not to. */
export function feedReader(input: string | Uint8Array, cuts: number[], rule: Completeness, rewrite: DataRewrite | null = null, end = true): Fed {
  const reader = sseReader(rule, rewrite);
  const bytes = typeof input === "string" ? enc.encode(input) : input;
  const out: Uint8Array[] = [];
  let error: EngineError | null = null;
  let errors = 0;
  const take = (r: { pass: Uint8Array; error: EngineError | null }) => {
    out.push(r.pass);
    if (r.error) {
      error = r.error;
      errors++;
    }
  };
  let at = 0;
  for (const c of [...new Set(cuts.filter((x) => x > 0 && x < bytes.length))].sort((a, b) => a - b)) {
    take(reader.feed(bytes.subarray(at, c)));
    at = c;
  }
  take(reader.feed(bytes.subarray(at)));
  if (end) take(reader.end());
  const all = new Uint8Array(out.reduce((n, p) => n + p.byteLength, 0));
  let k = 0;
  for (const p of out) {
    all.set(p, k);
    k += p.byteLength;
  }
  return { bytes: all, out: new TextDecoder().decode(all), error, errors, complete: reader.complete, settled: reader.settled, tooLong: reader.tooLong };
}
