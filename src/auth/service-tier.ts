import { TIERS, type Tier } from "../state/admission-queue";

// Service tiers (SPEC 9): OpenAI's `service_tier` request field names them; `auto` is OpenAI's
// "the project's default", which here is `default`. An API key may carry one (`API_KEYS` entry
// `key:tier`), which caps what its requests may ask for.

/** The values `service_tier` may take (anything else is a 400 naming the field). */
export const SERVICE_TIERS = ["auto", "default", "flex", "priority"] as const;
export type ServiceTier = (typeof SERVICE_TIERS)[number];

/** A tier as written (request field or key suffix), or null when it is not one. */
export function tierOf(value: unknown): Tier | null {
  if (value === "auto") return "default";
  return TIERS.find((t) => t === value) ?? null;
}

/**
 * The tier a request waits in: the one it asked for, else its key's, else `default`; never above
 * its key's (a key without a tier caps nothing).
 */
export function requestTier(requested: Tier | null, keyTier: Tier | null): Tier {
  const wanted = requested ?? keyTier ?? "default";
  return keyTier !== null && TIERS.indexOf(wanted) < TIERS.indexOf(keyTier) ? keyTier : wanted;
}

/**
 * One `API_KEYS` entry: `key` or `key:tier`. Only a known tier after the last colon is read as
 * one, so a key that itself holds a colon still works; the key alone authenticates.
 */
export function parseKeyEntry(entry: string): { key: string; tier: Tier | null } {
  const at = entry.lastIndexOf(":");
  const tier = at > 0 ? tierOf(entry.slice(at + 1).trim()) : null;
  return tier ? { key: entry.slice(0, at).trim(), tier } : { key: entry, tier: null };
}
