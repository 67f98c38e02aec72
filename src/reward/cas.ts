// Second opinion for answers our own parser cannot read (`\sum_{k=1}^{10} k`, `\lfloor x \rfloor`,
// `\operatorname{lcm}(4,6)`): @cortex-js/compute-engine, pinned to 0.27.0 (the version npm resolves on
// Node 20). Used only for variable-free values that both sides evaluate to a real number; CE 0.27 compares
// two parse errors as equal, so validity is checked and its `isEqual` is never trusted.

import { createRequire } from 'node:module';

interface BoxedLike {
  isValid: boolean;
  json: unknown;
  N(): { re: number; im: number };
}
interface EngineLike {
  parse(latex: string): BoxedLike;
}

let engine: EngineLike | null | undefined;

// Loaded lazily (≈0.1–0.2 s) and synchronously, so `verify` stays sync and most checks never pay for it.
function ce(): EngineLike | null {
  if (engine === undefined) {
    try {
      const require = createRequire(import.meta.url);
      const mod = require('@cortex-js/compute-engine') as { ComputeEngine: new () => EngineLike };
      engine = new mod.ComputeEngine();
    } catch {
      engine = null;
    }
  }
  return engine;
}

// Heads whose numeric value CE only approximates (quadrature, limits) or that are not values.
const UNTRUSTED = /"(?:Integrate|Limit|Error|D|Derivative|Interval|Equal|Less|Greater|Element)"/;

// CE substitutes a value for unknowns (`\sum_{k=1}^{n} k` evaluates!), so any symbol that is not a
// named constant or an index bound by Sum/Product makes the answer "not a plain value".
function hasFreeSymbol(j: unknown, bound: Set<string>): boolean {
  if (typeof j === 'string') return !/^[A-Z][A-Za-z]+$/.test(j) && !j.startsWith("'") && !bound.has(j);
  if (!Array.isArray(j)) return false;
  const [head, ...args] = j;
  if ((head === 'Sum' || head === 'Product') && Array.isArray(args[1]) && args[1][0] === 'Tuple') {
    const [, v, ...limits] = args[1] as unknown[];
    if (typeof v !== 'string') return true;
    if (limits.some((l) => hasFreeSymbol(l, bound))) return true;
    return hasFreeSymbol(args[0], new Set([...bound, v])) || args.length > 2;
  }
  return args.some((a) => hasFreeSymbol(a, bound));
}

/** The real value of a variable-free LaTeX answer per the CAS, or null when it has none we trust. */
// CE has no time limit of its own and happily computes `(2^{1000})!`; inputs that can blow up are refused.
const RISKY = /!|\\binom|\^\s*\{?\s*-?\d{3,}|\d{13,}/;

export function casValue(latex: string): number | null {
  if (latex.length > 200 || RISKY.test(latex)) return null;
  const e = ce();
  if (!e) return null;
  // CE reports some internal type errors on the console; they are not ours to print.
  const saved = [console.error, console.warn, console.log];
  console.error = console.warn = console.log = () => {};
  try {
    const x = e.parse(latex);
    if (!x.isValid || UNTRUSTED.test(JSON.stringify(x.json)) || hasFreeSymbol(x.json, new Set())) return null;
    const n = x.N();
    if (!Number.isFinite(n.re) || (n.im !== 0 && !Number.isNaN(n.im))) return null;
    return n.re;
  } catch {
    return null;
  } finally {
    [console.error, console.warn, console.log] = saved;
  }
}

export function casAvailable(): boolean {
  return ce() !== null;
}
