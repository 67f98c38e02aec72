// Exact rationals on BigInt: integers, decimals, fractions, percentages and scientific notation compare
// exactly, so `0.5` vs `\frac12` or `1e3` vs `1000` never depends on float rounding.

export interface Rat {
  n: bigint;
  d: bigint; // always > 0, gcd(n, d) = 1
}

function gcd(a: bigint, b: bigint): bigint {
  if (a < 0n) a = -a;
  if (b < 0n) b = -b;
  while (b !== 0n) [a, b] = [b, a % b];
  return a;
}

export function rat(n: bigint, d = 1n): Rat {
  if (d === 0n) throw new RangeError('division by zero');
  if (d < 0n) {
    n = -n;
    d = -d;
  }
  const g = gcd(n, d);
  return g > 1n ? { n: n / g, d: d / g } : { n, d };
}

export const ZERO = rat(0n);
export const ONE = rat(1n);

export const add = (a: Rat, b: Rat): Rat => rat(a.n * b.d + b.n * a.d, a.d * b.d);
export const sub = (a: Rat, b: Rat): Rat => rat(a.n * b.d - b.n * a.d, a.d * b.d);
export const mul = (a: Rat, b: Rat): Rat => rat(a.n * b.n, a.d * b.d);
export const div = (a: Rat, b: Rat): Rat => rat(a.n * b.d, a.d * b.n);
export const neg = (a: Rat): Rat => ({ n: -a.n, d: a.d });
export const eq = (a: Rat, b: Rat): boolean => a.n === b.n && a.d === b.d;
export const isInt = (a: Rat): boolean => a.d === 1n;

function bitLen(x: bigint): number {
  return (x < 0n ? -x : x).toString(2).length;
}

// Integer powers only, and only while the result stays small enough to be cheap: a model answer like
// `2^{10^9}` must not stall a worker, so oversized powers return null and fall back to floats.
export const MAX_BITS = 4096;
export function powInt(a: Rat, e: bigint): Rat | null {
  if (e === 0n) return ONE;
  const ae = e < 0n ? -e : e;
  if ((a.n === 0n || a.n === 1n || a.n === -1n) && a.d === 1n) {
    if (a.n === 0n) return e < 0n ? null : ZERO;
    return rat(a.n === -1n && ae % 2n === 1n ? -1n : 1n);
  }
  if (ae * BigInt(Math.max(bitLen(a.n), bitLen(a.d))) > BigInt(MAX_BITS)) return null;
  const r = rat(a.n ** ae, a.d ** ae);
  return e < 0n ? (r.n === 0n ? null : div(ONE, r)) : r;
}

export function factorial(a: Rat): Rat | null {
  if (!isInt(a) || a.n < 0n || a.n > 500n) return null;
  let r = 1n;
  for (let i = 2n; i <= a.n; i++) r *= i;
  return rat(r);
}

export function binom(n: Rat, k: Rat): Rat | null {
  if (!isInt(n) || !isInt(k) || n.n < 0n || n.n > 5000n) return null;
  if (k.n < 0n || k.n > n.n) return ZERO;
  let r = 1n;
  let kk = n.n - k.n;
  if (k.n < kk) kk = k.n;
  for (let i = 1n; i <= kk; i++) r = (r * (n.n - kk + i)) / i;
  return rat(r);
}

export function toNumber(a: Rat): number {
  const n = Number(a.n);
  const d = Number(a.d);
  if (Number.isFinite(n) && Number.isFinite(d)) return n / d;
  // Huge numerators/denominators: scale down through a decimal string.
  return Number.parseFloat(toDecimal(a, 20));
}

/** Round half away from zero to `digits` decimals, as an exact scaled integer. */
export function roundScaled(a: Rat, digits: number): bigint {
  const scale = 10n ** BigInt(digits);
  const num = a.n * scale;
  const q = num / a.d;
  const r = num % a.d;
  const twice = (r < 0n ? -r : r) * 2n;
  if (twice >= a.d) return num < 0n ? q - 1n : q + 1n;
  return q;
}

export function toDecimal(a: Rat, digits: number): string {
  const s = roundScaled(a, digits);
  const neg = s < 0n;
  const abs = (neg ? -s : s).toString().padStart(digits + 1, '0');
  return `${neg ? '-' : ''}${abs.slice(0, abs.length - digits)}.${abs.slice(abs.length - digits)}`;
}

export function ratToString(a: Rat): string {
  return a.d === 1n ? a.n.toString() : `${a.n}/${a.d}`;
}

/** Parses `123`, `-1.50`, `.5`, `1.5e-3` exactly; null if the text is not such a number. */
export function parseDecimal(s: string): Rat | null {
  const m = /^([+-]?)(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?$/.exec(s);
  if (!m || (m[2] === '' && (m[3] ?? '') === '')) return null;
  const frac = m[3] ?? '';
  let r = rat(BigInt((m[2] || '0') + frac), 10n ** BigInt(frac.length));
  if (m[4] !== undefined) {
    const e = BigInt(m[4]);
    if (e > 4000n || e < -4000n) return null;
    r = e >= 0n ? mul(r, rat(10n ** e)) : div(r, rat(10n ** -e));
  }
  return m[1] === '-' ? neg(r) : r;
}
