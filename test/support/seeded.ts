// @ts-expect-error plain JS module of the benchmark
import { mulberry32 } from "../../bench/lib/text.mjs";

/**
 * Math.random for tests, seeded: the same values on every run, so what a random suffix decides
 * (a prompt's hash, the node it lands on, a cached prefix) is the same each time a test runs.
 * One generator a file (its own seed); values still differ call to call.
 */
export const seededRandom = (seed: number): (() => number) => mulberry32(seed);
