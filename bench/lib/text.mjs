// Deterministic filler text: a seeded PRNG over a small word list (same seed, same text).

const WORDS = (
  'alpha bravo cedar delta ember fjord gamma harbor iris juniper kelp lumen maple nectar opal prism quartz raven sierra tundra umber velvet willow xenon yarrow zephyr ' +
  'anchor beacon canyon dune echo falcon glacier hollow island jade kettle lagoon meadow north orbit pine quill river stone timber'
).split(' ');

/** @param {number} seed 32-bit */
export function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * `prefix` followed by seeded words, exactly `chars` characters of ASCII.
 * @param {number} seed @param {number} chars @param {string} [prefix]
 */
export function seededText(seed, chars, prefix = '') {
  const rand = mulberry32(seed);
  const parts = [prefix];
  let length = prefix.length;
  while (length < chars) {
    const word = WORDS[Math.floor(rand() * WORDS.length)];
    parts.push(' ', word);
    length += 1 + word.length;
  }
  return parts.join('').slice(0, chars);
}
