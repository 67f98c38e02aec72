// Seeded PRNG (SplitMix32-style mixing over a 32-bit state): deterministic across platforms, so
// sampling decisions (RoC negatives, data splits, random-point checks) reproduce from a seed.
/** A stable 32-bit seed for a tuple (run seed, stage, step, purpose; a rollout's seed, problem id, sample): resumed
 *  work redraws exactly the same, and tuples that differ anywhere draw apart. */
export function seedFor(...parts: (number | string)[]): number {
  let h = 0x811c9dc5;
  for (const c of parts.join('|')) h = Math.imul(h ^ c.charCodeAt(0), 0x01000193) >>> 0;
  return h;
}

export class Rng {
  private state: number;
  constructor(seed: number) {
    this.state = seed >>> 0;
  }
  /** Uniform in [0, 1). */
  next(): number {
    this.state = (this.state + 0x9e3779b9) >>> 0;
    let z = this.state;
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
    z = (z ^ (z >>> 16)) >>> 0;
    return z / 4294967296;
  }
  /** Integer in [lo, hi] inclusive. */
  int(lo: number, hi: number): number {
    return lo + Math.floor(this.next() * (hi - lo + 1));
  }
  pick<T>(xs: readonly T[]): T {
    if (xs.length === 0) throw new Error('Rng.pick: empty array');
    return xs[Math.floor(this.next() * xs.length)];
  }
  /** Fisher-Yates shuffle of a copy. */
  shuffle<T>(xs: readonly T[]): T[] {
    const a = xs.slice();
    for (let i = a.length - 1; i > 0; i--) {
      const j = Math.floor(this.next() * (i + 1));
      [a[i], a[j]] = [a[j], a[i]];
    }
    return a;
  }
  /** k distinct items, uniformly, order preserved from the input. */
  sample<T>(xs: readonly T[], k: number): T[] {
    if (k >= xs.length) return xs.slice();
    const idx = this.shuffle(xs.map((_, i) => i))
      .slice(0, k)
      .sort((a, b) => a - b);
    return idx.map((i) => xs[i]);
  }
}
