// Secrets are compared through their SHA-256 digests, so the comparison takes the same time
// whatever the inputs' lengths or contents (no early exit an attacker could time).

const encoder = new TextEncoder();

export async function sha256(text: string): Promise<Uint8Array> {
  return new Uint8Array(await crypto.subtle.digest("SHA-256", encoder.encode(text)));
}

function toHex(bytes: Uint8Array): string {
  return [...bytes].map((b) => b.toString(16).padStart(2, "0")).join("");
}

/** Constant-time equality of two secrets (digests are always 32 bytes long). */
export async function secretEquals(given: string, expected: string): Promise<boolean> {
  const [a, b] = await Promise.all([sha256(given), sha256(expected)]);
  const subtle = crypto.subtle as SubtleCrypto & { timingSafeEqual?: (a: ArrayBufferView, b: ArrayBufferView) => boolean };
  if (typeof subtle.timingSafeEqual === "function") return subtle.timingSafeEqual(a, b);
  let diff = 0;
  for (let i = 0; i < a.length; i++) diff |= a[i]! ^ b[i]!;
  return diff === 0;
}

/** Which of `expected` equals `given` (-1: none); every candidate is compared, match or not. */
export async function matchIndex(given: string, expected: readonly string[]): Promise<number> {
  const results = await Promise.all(expected.map((e) => secretEquals(given, e)));
  return results.indexOf(true);
}

/** The label of an API key in metrics and logs: a short hash, never the key. */
export async function keyLabel(key: string): Promise<string> {
  return toHex(await sha256(`pd-edge-router/api-key\u0000${key}`)).slice(0, 12);
}
