// Hashing for selection. SHA-256 (Web Crypto) names affinity keys and prefix blocks; a fast
// synchronous 52-bit mix scores rendezvous pairs, because ranking must stay synchronous and runs
// once per node per request. Both depend only on the input string, so every isolate agrees.

const encoder = new TextEncoder();

/** Lower-case hex of a byte buffer's first `bytes` bytes (all of it by default). */
export function toHex(buffer: ArrayBuffer, bytes?: number): string {
  return [...new Uint8Array(buffer, 0, bytes)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

/** Hex SHA-256 of the UTF-8 encoding of `text`. */
export async function sha256Hex(text: string): Promise<string> {
  return toHex(await crypto.subtle.digest("SHA-256", encoder.encode(text)));
}

/**
 * A 52-bit non-cryptographic hash of `text` (cyrb53-style: two multiplicative 32-bit lanes over
 * the UTF-16 code units, cross-mixed at the end). Pure integer arithmetic via Math.imul, so the
 * result is identical on every JS engine.
 */
export function hash52(text: string): number {
  let h1 = 0xdeadbeef;
  let h2 = 0x41c6ce57;
  for (let i = 0; i < text.length; i++) {
    const ch = text.charCodeAt(i);
    h1 = Math.imul(h1 ^ ch, 2654435761);
    h2 = Math.imul(h2 ^ ch, 1597334677);
  }
  h1 = Math.imul(h1 ^ (h1 >>> 16), 2246822507);
  h1 ^= Math.imul(h2 ^ (h2 >>> 13), 3266489909);
  h2 = Math.imul(h2 ^ (h2 >>> 16), 2246822507);
  h2 ^= Math.imul(h1 ^ (h1 >>> 13), 3266489909);
  return (h2 & 0xfffff) * 2 ** 32 + (h1 >>> 0);
}

const TWO_POW_52 = 2 ** 52;

/**
 * A uniform double strictly inside (0, 1) for the pair (key, nodeId). `(h + 0.5) / 2^52` is exact
 * in binary64 for every 52-bit h, so it can be neither 0 nor 1 (ln(u) is finite and negative).
 */
export function rendezvousUnit(key: string, nodeId: string): number {
  return (hash52(`${key}\u0000${nodeId}`) + 0.5) / TWO_POW_52;
}
