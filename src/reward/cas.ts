// Second opinion for answers our own parser cannot read (`\sum_{k=1}^{10} k`, `\lfloor x \rfloor`,
// `\operatorname{lcm}(4,6)`): @cortex-js/compute-engine, pinned to 0.27.0 (the version npm resolves on
// Node 20). Used only for variable-free values that both sides evaluate to a real number; CE 0.27 compares
// two parse errors as equal, so validity is checked and its `isEqual` is never trusted.

import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

interface BoxedLike {
  isValid: boolean;
  json: unknown;
  N(): { re: number; im: number };
}
interface EngineLike {
  parse(latex: string, options?: object): BoxedLike;
}

const PACKAGE = '@cortex-js/compute-engine';
let engine: EngineLike | null | undefined;
let loadError: string | null = null;

// Loaded lazily (≈0.1–0.2 s) and synchronously, so `verify` stays sync and most checks never pay for it.
// The package's `require` condition names a UMD file inside a `"type": "module"` package: plain Node loads
// it as an ES module, where the UMD wrapper finds no `exports` and exports nothing (only tsx's CommonJS
// hook, registered on the main thread alone, made it work). So the ESM entry is resolved through the
// `import` condition and loaded with require(esm) (Node ≥ 20.19 / 22.12), the same in worker threads,
// under tsx and in compiled JS. A failure is reported once per thread and in `casLoadError()`.
function ce(): EngineLike | null {
  if (engine === undefined) {
    try {
      const entry = fileURLToPath(import.meta.resolve(PACKAGE));
      const mod = createRequire(import.meta.url)(entry) as { ComputeEngine?: new () => EngineLike };
      if (typeof mod.ComputeEngine !== 'function')
        throw new Error(
          `${entry} has no ComputeEngine export (got: ${Object.keys(mod).join(', ') || 'none'})`,
        );
      engine = new mod.ComputeEngine();
      budgetParser(engine);
    } catch (e) {
      const err = e as NodeJS.ErrnoException;
      const hint =
        err.code === 'ERR_REQUIRE_ESM' ? ' (loading it needs require(esm): Node ≥ 20.19 or 22.12)' : '';
      loadError = `cannot load ${PACKAGE}: ${err.message ?? String(e)}${hint}`;
      engine = null;
      process.emitWarning(`${loadError}; answers only the CAS can read will score "unknown"`, {
        code: 'RSTAR2_CAS_UNAVAILABLE',
      });
    }
  }
  return engine;
}

/** Token reads one CE parse may make; the worst answer in our corpora and benchmarks takes about 11,000. */
export const PARSE_STEPS = 100_000;

class ParseBudget extends Error {}

// CE's LaTeX parser backtracks on malformed input: every prefix-operator definition and every delimiter
// pairing is tried in turn and each try re-parses the rest, so `#` and 76 dashes, or a dozen `[`, take
// exponential time (12 `[`: 4 min; 76 dashes: never). Every step of it reads a token through `peek`, so
// a count of those reads per parser bounds a parse whatever the input; past it the answer has no CAS value.
// The parser class is not exported: its prototype is taken from the one callback that is handed a parser.
function budgetParser(e: EngineLike): void {
  const protos: object[] = [];
  e.parse(')', {
    parseUnexpectedToken: (_lhs: unknown, parser: object) => {
      protos.push(Object.getPrototypeOf(parser));
      return null;
    },
  });
  const proto = protos[0];
  const peek = proto && Object.getOwnPropertyDescriptor(proto, 'peek')?.get;
  if (!peek) throw new Error('cannot find its LaTeX parser to bound (CE version other than 0.27?)');
  const steps = new WeakMap<object, number>();
  Object.defineProperty(proto, 'peek', {
    configurable: true,
    get(this: object) {
      const n = (steps.get(this) ?? 0) + 1;
      if (n > PARSE_STEPS) throw new ParseBudget(`more than ${PARSE_STEPS} parse steps`);
      steps.set(this, n);
      return peek.call(this);
    },
  });
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

/** Why the CAS failed to load in this thread, or null (also null before anything asked for it). */
export function casLoadError(): string | null {
  return loadError;
}
