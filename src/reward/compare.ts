// Equivalence of two parsed answers. Gold-driven and conservative: every path either proves equality
// (exactly, by a stated float rule, or at seeded random points) or says "not equal"/"unknown", and the
// caller scores "unknown" as wrong.

import { Rng } from '../util/rng.js';
import { type Node, show } from './parse.js';
import * as R from './rational.js';

export type Verdict = 'equal' | 'not-equal' | 'unknown';
export interface Outcome {
  verdict: Verdict;
  by: string; // the comparison path that decided
}

export interface CompareOptions {
  /** Decimals both sides are rounded to when either side is written as a decimal (Math-Verify: 6). */
  floatRounding: number;
  /** Relative tolerance for numbers (lenient profile: 1e-4, as PRIME's math_equal); 0 = off. */
  relTol: number;
  /** Also accept pred = gold·100 or gold/100 for plain numbers (PRIME's percentage leniency). */
  percentTimes100: boolean;
  /**
   * `relTol` (and `percentTimes100`) also between two integers, as PRIME's math_equal compares any two
   * numbers in floats: 100000 ≈ 100001 at 1e-4. Off, two integers are equal only when they are equal.
   */
  nearMissIntegers: boolean;
  /** Also evaluate π as 3.14 (PRIME evaluates `\pi` both ways). */
  piAs314: boolean;
  /** `10\%` also equals a bare `10` (the percent sign read as a unit), besides its value 0.1. */
  percentAsUnit: boolean;
  /** Seed for random-point evaluation, so a verdict reproduces. */
  seed: number;
  /** Number of random points for expressions with variables. */
  points: number;
  /**
   * Math-Verify's wider readings (the reference profile): any left side made only of symbols is an
   * assignment (`(p,q)=(3,2)`, `f(x)=1`, `|AB|=1`), chains `x=a=b` compare as `x=b`, a predicted equation
   * against a plain gold compares its last right side, a gold relation in one variable against a predicted
   * set, lists compare as sets (duplicates collapse), matrix sums and products are evaluated.
   */
  mathVerify: boolean;
  /** Absolute deadline (Date.now() ms); past it the comparison stops with "unknown". */
  deadline: number;
}

export class Timeout extends Error {}

const eqv = (by: string): Outcome => ({ verdict: 'equal', by });
const neq = (by: string): Outcome => ({ verdict: 'not-equal', by });
const unk = (by: string): Outcome => ({ verdict: 'unknown', by });

// ---- evaluation -------------------------------------------------------------------------------------

function isqrt(n: bigint): bigint | null {
  if (n < 0n) return null;
  if (n < 2n) return n;
  let x = BigInt(Math.floor(Math.sqrt(Number(n))));
  while (x * x > n) x--;
  while ((x + 1n) * (x + 1n) <= n) x++;
  return x * x === n ? x : null;
}

/** Exact rational value, or null when the value is not (provably) rational here. */
export function evalExact(n: Node): R.Rat | null {
  switch (n.t) {
    case 'num':
      return n.v;
    case 'neg': {
      const a = evalExact(n.a);
      return a && R.neg(a);
    }
    case 'add': {
      let acc = R.ZERO;
      for (const x of n.a) {
        const v = evalExact(x);
        if (!v) return null;
        acc = R.add(acc, v);
      }
      return acc;
    }
    case 'mul': {
      let acc = R.ONE;
      for (const x of n.a) {
        const v = evalExact(x);
        if (!v) return null;
        acc = R.mul(acc, v);
      }
      return acc;
    }
    case 'div': {
      const a = evalExact(n.a);
      const b = evalExact(n.b);
      if (!a || !b || b.n === 0n) return null;
      return R.div(a, b);
    }
    case 'pow': {
      const a = evalExact(n.a);
      const b = evalExact(n.b);
      if (!a || !b) return null;
      if (b.d === 1n) return R.powInt(a, b.n);
      if (b.d === 2n && a.n >= 0n) {
        const rn = isqrt(a.n);
        const rd = isqrt(a.d);
        if (rn === null || rd === null) return null;
        return R.powInt(R.rat(rn, rd), b.n);
      }
      return null;
    }
    case 'pct': {
      const a = evalExact(n.a);
      return a && R.div(a, R.rat(100n));
    }
    case 'fn': {
      const args = n.args.map(evalExact);
      if (args.some((a) => a === null)) return null;
      const a = args as R.Rat[];
      if (n.name === 'sqrt') {
        const rn = isqrt(a[0].n);
        const rd = isqrt(a[0].d);
        return rn !== null && rd !== null ? R.rat(rn, rd) : null;
      }
      if (n.name === 'fact') return R.factorial(a[0]);
      if (n.name === 'binom') return R.binom(a[0], a[1]);
      if (n.name === 'abs') return a[0].n < 0n ? R.neg(a[0]) : a[0];
      return null;
    }
    default:
      return null;
  }
}

type Env = Map<string, number>;

function gamma(x: number): number {
  if (Number.isInteger(x) && x >= 0 && x <= 170) {
    let r = 1;
    for (let i = 2; i <= x; i++) r *= i;
    return r;
  }
  return Number.NaN;
}

export function evalNum(n: Node, env: Env, pi = Math.PI): number {
  switch (n.t) {
    case 'num':
      return R.toNumber(n.v);
    case 'sym': {
      const v = env.get(n.name);
      return v === undefined ? Number.NaN : v;
    }
    case 'const':
      return n.name === 'pi' ? pi : n.name === 'e' ? Math.E : Number.POSITIVE_INFINITY;
    case 'neg':
      return -evalNum(n.a, env, pi);
    case 'add':
      return n.a.reduce((s, x) => s + evalNum(x, env, pi), 0);
    case 'mul':
      return n.a.reduce((s, x) => s * evalNum(x, env, pi), 1);
    case 'div':
      return evalNum(n.a, env, pi) / evalNum(n.b, env, pi);
    case 'pow': {
      const a = evalNum(n.a, env, pi);
      const b = evalNum(n.b, env, pi);
      // Odd roots of negatives are real: (-8)^(1/3) = -2.
      if (a < 0 && !Number.isInteger(b)) {
        const inv = 1 / b;
        if (
          Number.isInteger(Math.round(inv)) &&
          Math.abs(inv - Math.round(inv)) < 1e-12 &&
          Math.round(inv) % 2 !== 0
        ) {
          return -((-a) ** b);
        }
      }
      return a ** b;
    }
    case 'pct':
      return evalNum(n.a, env, pi) / 100;
    case 'fn': {
      const a = n.args.map((x) => evalNum(x, env, pi));
      const x = a[0];
      switch (n.name) {
        case 'sqrt':
          return Math.sqrt(x);
        case 'sin':
          return Math.sin(x);
        case 'cos':
          return Math.cos(x);
        case 'tan':
          return Math.tan(x);
        case 'sec':
          return 1 / Math.cos(x);
        case 'csc':
          return 1 / Math.sin(x);
        case 'cot':
          return 1 / Math.tan(x);
        case 'arcsin':
          return Math.asin(x);
        case 'arccos':
          return Math.acos(x);
        case 'arctan':
          return Math.atan(x);
        case 'sinh':
          return Math.sinh(x);
        case 'cosh':
          return Math.cosh(x);
        case 'tanh':
          return Math.tanh(x);
        case 'ln':
          return Math.log(x);
        case 'log':
          return Math.log10(x);
        case 'exp':
          return Math.exp(x);
        case 'abs':
          return Math.abs(x);
        case 'floor':
          return Math.floor(x);
        case 'ceil':
          return Math.ceil(x);
        case 'fact':
          return gamma(x);
        case 'binom':
          return gamma(x) / (gamma(a[1]) * gamma(x - a[1]));
      }
      return Number.NaN;
    }
    default:
      return Number.NaN;
  }
}

type C = [number, number];

// Complex value of the arithmetic subset (no functions but sqrt of a non-negative real); null = outside it.
function evalComplex(n: Node, env: Map<string, C>): C | null {
  const all = (xs: Node[]) => {
    const out: C[] = [];
    for (const x of xs) {
      const v = evalComplex(x, env);
      if (!v) return null;
      out.push(v);
    }
    return out;
  };
  const mul = (a: C, b: C): C => [a[0] * b[0] - a[1] * b[1], a[0] * b[1] + a[1] * b[0]];
  const div = (a: C, b: C): C => {
    const d = b[0] * b[0] + b[1] * b[1];
    return [(a[0] * b[0] + a[1] * b[1]) / d, (a[1] * b[0] - a[0] * b[1]) / d];
  };
  switch (n.t) {
    case 'num':
    case 'const':
      return [evalNum(n, new Map()), 0];
    case 'sym':
      return env.get(n.name) ?? null;
    case 'neg': {
      const a = evalComplex(n.a, env);
      return a && [-a[0], -a[1]];
    }
    case 'add':
    case 'mul': {
      const xs = all(n.a);
      if (!xs) return null;
      return n.t === 'add' ? xs.reduce((s, x) => [s[0] + x[0], s[1] + x[1]], [0, 0]) : xs.reduce(mul, [1, 0]);
    }
    case 'div': {
      const xs = all([n.a, n.b]);
      return xs && div(xs[0], xs[1]);
    }
    case 'pow': {
      const xs = all([n.a, n.b]);
      if (!xs) return null;
      const [a, b] = xs;
      if (b[1] === 0 && Number.isInteger(b[0]) && Math.abs(b[0]) <= 64) {
        let r: C = [1, 0];
        for (let k = 0; k < Math.abs(b[0]); k++) r = mul(r, a);
        return b[0] < 0 ? div([1, 0], r) : r;
      }
      return a[1] === 0 && b[1] === 0 && a[0] >= 0 ? [a[0] ** b[0], 0] : null;
    }
    case 'fn': {
      if (n.name !== 'sqrt') return null;
      const a = evalComplex(n.args[0], env);
      return a && a[1] === 0 && a[0] >= 0 ? [Math.sqrt(a[0]), 0] : null;
    }
    default:
      return null;
  }
}

export function freeVars(n: Node, out = new Set<string>()): Set<string> {
  if (n.t === 'sym') out.add(n.name);
  for (const c of children(n)) freeVars(c, out);
  return out;
}

function children(n: Node): Node[] {
  switch (n.t) {
    case 'add':
    case 'mul':
      return n.a;
    case 'neg':
    case 'pct':
      return [n.a];
    case 'div':
    case 'pow':
    case 'pm':
      return [n.a, n.b];
    case 'fn':
      return n.args;
    case 'tuple':
    case 'set':
    case 'list':
    case 'union':
      return n.items;
    case 'matrix':
      return n.rows.flat();
    case 'rel':
      return n.parts;
    default:
      return [];
  }
}

export function hasFloat(n: Node): boolean {
  return (n.t === 'num' && n.float) || children(n).some(hasFloat);
}

function hasConst(n: Node, name: string): boolean {
  return (n.t === 'const' && n.name === name) || children(n).some((c) => hasConst(c, name));
}

// ---- ± expansion --------------------------------------------------------------------------------------

/** `a \pm b` → [a+b, a-b] (Math-Verify's reading: a two-element set); nested ± multiply out. */
export function expandPm(n: Node): Node[] {
  if (n.t === 'pm') {
    const out: Node[] = [];
    for (const a of expandPm(n.a)) {
      for (const b of expandPm(n.b)) {
        out.push({ t: 'add', a: [a, b] }, { t: 'add', a: [a, { t: 'neg', a: b }] });
      }
    }
    return n.sign > 0 ? out : out.map((_, i) => out[i ^ 1]);
  }
  if (
    n.t === 'tuple' ||
    n.t === 'set' ||
    n.t === 'list' ||
    n.t === 'union' ||
    n.t === 'matrix' ||
    n.t === 'text'
  ) {
    return [n];
  }
  const kids = children(n);
  for (let i = 0; i < kids.length; i++) {
    const ex = expandPm(kids[i]);
    if (ex.length > 1) return ex.flatMap((e) => expandPm(replaceChild(n, i, e)));
  }
  return [n];
}

function replaceChild(n: Node, i: number, c: Node): Node {
  switch (n.t) {
    case 'add':
    case 'mul': {
      const a = n.a.slice();
      a[i] = c;
      return { ...n, a };
    }
    case 'neg':
    case 'pct':
      return { ...n, a: c };
    case 'div':
    case 'pow':
      return i === 0 ? { ...n, a: c } : { ...n, b: c };
    case 'fn': {
      const args = n.args.slice();
      args[i] = c;
      return { ...n, args };
    }
    case 'rel': {
      const parts = n.parts.slice();
      parts[i] = c;
      return { ...n, parts };
    }
    default:
      return n;
  }
}

/** Collections get their ± elements expanded in place; a scalar with ± becomes a set. */
export function structure(n: Node): Node {
  if (n.t === 'list' || n.t === 'set') return { ...n, items: n.items.flatMap(expandPm) };
  if (n.t === 'tuple') return { ...n, items: n.items.map(structure) };
  const ex = expandPm(n);
  return ex.length > 1 ? { t: 'set', items: ex } : n;
}

// ---- comparison ---------------------------------------------------------------------------------------

export class Comparer {
  constructor(private readonly o: CompareOptions) {}

  private tick(): void {
    if (Date.now() > this.o.deadline) throw new Timeout('time limit');
  }

  compare(gold: Node, pred: Node): Outcome {
    return this.node(structure(gold), structure(pred));
  }

  private node(g: Node, p: Node): Outcome {
    this.tick();
    if (this.o.mathVerify) {
      const r = this.mathVerifyNode(g, p);
      if (r) return r;
    }
    if (g.t === 'text' || p.t === 'text') {
      if (g.t === 'text' && p.t === 'text') return g.s === p.s ? eqv('text') : neq('text');
      return neq('text-vs-math');
    }
    if (g.t === 'rel' && p.t === 'rel') return this.rel(g, p);
    if (g.t === 'rel') {
      const rhs = assignedValue(g);
      if (rhs) return this.node(rhs, p);
      const iv = relToInterval(g, (n) => n.t === 'sym');
      if (iv && (p.t === 'tuple' || p.t === 'union')) return this.node(iv, p);
      return neq('relation-vs-value');
    }
    if (p.t === 'rel') {
      // `x = v`, a chain `x = a = v`, or a worked computation `2+\frac53+1 = \frac{14}{3}` (no variables
      // on the left): the last right-hand side is the answer.
      const computed = p.ops.every((o) => o === '=') && freeVars(p.parts[0]).size === 0;
      const rhs = assignedValue(p) ?? (computed || p.parts.length >= 3 ? p.parts.at(-1) : null);
      if (rhs) return this.node(g, rhs);
      return neq('value-vs-relation');
    }
    if (isCollection(g) || isCollection(p)) return this.collection(g, p);
    return this.scalar(g, p);
  }

  // Math-Verify's assignment and relation rules; null = no rule applies, compare as usual.
  private mathVerifyNode(g: Node, p: Node): Outcome | null {
    const G = g.t === 'rel' ? assignment(g) : null;
    const P = p.t === 'rel' ? assignment(p) : null;
    if (G && P) {
      if (show(G.lhs) !== show(P.lhs)) return neq('assignment-variable');
      const r = this.node(G.rhs, P.rhs);
      return { verdict: r.verdict, by: `assignment:${r.by}` };
    }
    if (g.t !== 'rel' && p.t === 'rel' && p.ops.every((o) => o === '='))
      return this.node(g, p.parts.at(-1) as Node);
    if (G && p.t !== 'rel') return this.node(G.rhs, p);
    if (g.t === 'rel' && (isCollection(p) || (P && isCollection(P.rhs)))) {
      const iv = relToInterval(g, onlySymbols);
      if (iv) return this.node(iv, P ? P.rhs : p);
    }
    return null;
  }

  private collection(g: Node, p: Node): Outcome {
    if (g.t === 'matrix' || p.t === 'matrix') return this.matrix(g, p);
    if (g.t === 'union' || p.t === 'union') {
      if (g.t !== 'union' || p.t !== 'union') return neq('union-shape');
      return this.unordered(g.items, p.items, 'union');
    }
    if (g.t === 'tuple' && p.t === 'tuple') {
      if (g.open !== p.open || g.close !== p.close) return neq('interval-openness');
      return this.ordered(g.items, p.items, g.open === '(' && g.close === ')' ? 'tuple' : 'interval');
    }
    if (g.t === 'tuple') {
      if (p.t !== 'list' && p.t !== 'set') return neq('shape');
      if (g.open !== '(' || g.close !== ')') return neq('interval-vs-list');
      // `y = 1, x = 2` against `(2, 1)`: the names fix the order, not where they were written.
      const named = this.o.mathVerify ? null : byName(p);
      if (named) return this.ordered(g.items, named, 'tuple-by-name');
      return this.ordered(g.items, p.items, 'tuple-in-written-order');
    }
    if (g.t === 'list' || g.t === 'set') {
      if (p.t === 'list' || p.t === 'set') return this.unordered(g.items, p.items, 'set');
      if (p.t === 'tuple' && p.open === '(' && p.close === ')') {
        // A gold `a = 1, b = 2` is the pair (a, b), so `(2, 1)` is wrong; a list of values is a set.
        const named = this.o.mathVerify || g.t !== 'list' ? null : byName(g);
        if (named) return this.ordered(named, p.items, 'tuple-by-name');
        return this.unordered(g.items, p.items, 'set');
      }
      return neq('shape');
    }
    return neq('shape');
  }

  private matrix(g: Node, p: Node): Outcome {
    const rows = (n: Node): Node[][] | null =>
      n.t === 'matrix'
        ? n.rows
        : n.t === 'tuple' && n.open === n.close.replace(')', '(').replace(']', '[')
          ? n.items.map((x) => [x]) // a vector written `(a, b)` or `[a, b]`
          : this.o.mathVerify
            ? matrixValue(n)
            : null;
    const a = rows(g);
    const b = rows(p);
    if (!a || !b) return neq('matrix-shape');
    // A vector written as a tuple equals a column vector.
    const flat = (m: Node[][]) => (m.length === 1 ? m[0].map((x) => [x]) : m);
    const A = flat(a);
    const B = flat(b);
    if (A.length !== B.length || A.some((r, i) => r.length !== B[i].length)) return neq('matrix-shape');
    return this.ordered(A.flat(), B.flat(), 'matrix');
  }

  private ordered(a: Node[], b: Node[], by: string): Outcome {
    if (a.length !== b.length) return neq(`${by}-length`);
    let unknown = false;
    for (let i = 0; i < a.length; i++) {
      const r = this.node(a[i], b[i]);
      if (r.verdict === 'not-equal') return neq(`${by}:${r.by}`);
      if (r.verdict === 'unknown') unknown = true;
    }
    return unknown ? unk(by) : eqv(by);
  }

  // Multiset matching; greedy is enough because element equality is an equivalence relation.
  private unordered(a: Node[], b: Node[], by: string): Outcome {
    if (this.o.mathVerify) return this.sameSet(a, b, by);
    if (a.length !== b.length) return neq(`${by}-size`);
    const used = new Array<boolean>(b.length).fill(false);
    for (const x of a) {
      let found = false;
      for (let j = 0; j < b.length && !found; j++) {
        if (!used[j] && this.node(x, b[j]).verdict === 'equal') {
          used[j] = true;
          found = true;
        }
      }
      if (!found) return neq(`${by}-element`);
    }
    return eqv(by);
  }

  // Set semantics (Math-Verify builds sympy FiniteSets, which drop duplicates): each side covers the other.
  private sameSet(a: Node[], b: Node[], by: string): Outcome {
    const covers = (xs: Node[], ys: Node[], swap: boolean) =>
      xs.every((x) => ys.some((y) => (swap ? this.node(y, x) : this.node(x, y)).verdict === 'equal'));
    return covers(a, b, false) && covers(b, a, true) ? eqv(by) : neq(`${by}-element`);
  }

  private rel(g: Extract<Node, { t: 'rel' }>, p: Extract<Node, { t: 'rel' }>): Outcome {
    const G = orient(g);
    const P = orient(p);
    if (G.ops.join() !== P.ops.join()) return neq('relation-type');
    if (G.parts.length > 2) return this.ordered(G.parts, P.parts, 'relation-chain');
    const op = G.ops[0];
    if (op === 'in') return this.ordered(G.parts, P.parts, 'membership');
    const ga = G.parts[0];
    const pa = P.parts[0];
    if (op === '=' && ga.t === 'sym' && pa.t === 'sym') {
      if (ga.name !== pa.name) return neq('assignment-variable');
      const r = this.node(G.parts[1], P.parts[1]);
      return { verdict: r.verdict, by: `assignment:${r.by}` };
    }
    const dg: Node = { t: 'add', a: [G.parts[0], { t: 'neg', a: G.parts[1] }] };
    const dp: Node = { t: 'add', a: [P.parts[0], { t: 'neg', a: P.parts[1] }] };
    return this.proportional(dg, dp, op === '<' || op === '<=');
  }

  // Two relations `lhs-rhs` agree when their differences are proportional (2x=4 ≡ x=2); for
  // inequalities the factor must be positive.
  private proportional(a: Node, b: Node, positive: boolean): Outcome {
    const vars = [...new Set([...freeVars(a), ...freeVars(b)])];
    const pts = this.points(vars);
    let ratio: number | null = null;
    let valid = 0;
    for (const env of pts) {
      const x = evalNum(a, env);
      const y = evalNum(b, env);
      if (!Number.isFinite(x) || !Number.isFinite(y)) continue;
      if (Math.abs(x) < 1e-12 && Math.abs(y) < 1e-12) continue;
      if (Math.abs(y) < 1e-12 || Math.abs(x) < 1e-12) return neq('relation');
      const r = x / y;
      if (ratio === null) ratio = r;
      else if (Math.abs(r - ratio) > 1e-8 * Math.max(1, Math.abs(ratio))) return neq('relation');
      valid++;
    }
    if (ratio === null || valid < 3) return unk('relation-too-few-points');
    if (positive && ratio < 0) return neq('inequality-direction');
    return eqv('relation');
  }

  private points(vars: string[]): Env[] {
    const rng = new Rng(this.o.seed);
    const out: Env[] = [];
    for (let i = 0; i < this.o.points; i++) {
      const env: Env = new Map();
      for (const v of vars) {
        // Half the points positive (inside sqrt/log domains), half anywhere, so |x| vs x differ.
        env.set(v, i % 2 === 0 ? 0.3 + rng.next() * 2.2 : -2.5 + rng.next() * 5);
      }
      out.push(env);
    }
    return out;
  }

  private scalar(g: Node, p: Node): Outcome {
    const vars = new Set([...freeVars(g), ...freeVars(p)]);
    if (vars.size > 0) return this.randomPoints(g, p, [...vars]);
    const gs = this.o.percentAsUnit && g.t === 'pct' ? [g, g.a] : [g];
    const ps = this.o.percentAsUnit && p.t === 'pct' ? [p, p.a] : [p];
    let best: Outcome | null = null;
    for (const a of gs) {
      for (const b of ps) {
        const r = this.value(a, b);
        const by = a !== g || b !== p ? `percent-as-unit:${r.by}` : r.by;
        if (r.verdict === 'equal') return eqv(by);
        if (!best || (best.verdict === 'not-equal' && r.verdict === 'unknown'))
          best = { verdict: r.verdict, by };
      }
    }
    return best as Outcome;
  }

  private value(g: Node, p: Node): Outcome {
    const eg = evalExact(g);
    const ep = evalExact(p);
    const floats = hasFloat(g) || hasFloat(p);
    if (eg && ep) {
      if (R.eq(eg, ep)) return eqv(R.isInt(eg) ? 'integer' : 'exact-rational');
      if (floats && this.floatsAgree(R.toNumber(eg), R.toNumber(ep), eg, ep)) {
        return eqv('float-rounding');
      }
      if (R.isInt(eg) && R.isInt(ep)) {
        const by = integerLeniency(eg.n, ep.n, this.o);
        return by ? eqv(by) : neq('integer');
      }
      if (!this.lenient()) return neq('exact-rational');
    }
    const vg = evalNum(g, new Map());
    const vp = evalNum(p, new Map());
    if (Number.isNaN(vg) || Number.isNaN(vp)) return unk('not-a-number');
    if (!Number.isFinite(vg) || !Number.isFinite(vp)) {
      // Only a written \infty is infinite; an overflowing 2^{10^9} is merely too big to decide.
      const real = hasConst(g, 'inf') && hasConst(p, 'inf');
      if (!real) return unk('overflow');
      return vg === vp ? eqv('infinity') : neq('infinity');
    }
    if (floats) {
      if (this.floatsAgree(vg, vp)) return eqv('float-rounding');
    } else if (Math.abs(vg - vp) <= 1e-10 * Math.max(1, Math.abs(vg), Math.abs(vp))) {
      return eqv('numeric');
    }
    if (this.lenient()) {
      const close = (x: number, y: number) =>
        Math.abs(x - y) <= this.o.relTol * Math.max(Math.abs(x), Math.abs(y));
      if (this.o.relTol > 0 && close(vg, vp)) return eqv('lenient-tolerance');
      if (this.o.percentTimes100 && (close(vg * 100, vp) || close(vg / 100, vp)))
        return eqv('lenient-percent');
      if (this.o.piAs314 && (hasConst(g, 'pi') || hasConst(p, 'pi'))) {
        const g3 = evalNum(g, new Map(), 3.14);
        const p3 = evalNum(p, new Map(), 3.14);
        if (close(g3, vp) || close(vg, p3) || close(g3, p3)) return eqv('lenient-pi');
      }
    }
    return neq(floats ? 'float-rounding' : 'numeric');
  }

  // Math-Verify rounds both sides to 6 decimals; that alone accepts .0000672 for .0000673, so the same
  // number of significant digits must agree too (and 6 decimals stop 1234570 matching 1234567.89).
  private floatsAgree(a: number, b: number, ea?: R.Rat, eb?: R.Rat): boolean {
    return floatsAgree(a, b, this.o.floatRounding, ea, eb);
  }

  private lenient(): boolean {
    return this.o.relTol > 0 || this.o.percentTimes100 || this.o.piAs314;
  }

  private randomPoints(g: Node, p: Node, vars: string[]): Outcome {
    let valid = 0;
    for (const env of this.points(vars)) {
      const x = evalNum(g, env);
      const y = evalNum(p, env);
      if (!Number.isFinite(x) || !Number.isFinite(y)) continue;
      if (Math.abs(x - y) > 1e-8 * Math.max(1, Math.abs(x), Math.abs(y))) {
        return vars.includes('i') ? this.complexPoints(g, p, vars) : neq('random-points');
      }
      valid++;
    }
    return valid >= Math.min(4, this.o.points) ? eqv('random-points') : unk('random-points-too-few-valid');
  }

  // `i` as the imaginary unit (`i(2-i)` = `1+2i`), as Math-Verify reads it when an answer mentions i; only
  // after `i` as a plain variable failed, so `i` as an index loses nothing.
  private complexPoints(g: Node, p: Node, vars: string[]): Outcome {
    let valid = 0;
    for (const env of this.points(vars)) {
      const cenv = new Map<string, C>([...env].map(([k, v]): [string, C] => [k, [v, 0]]));
      cenv.set('i', [0, 1]);
      const x = evalComplex(g, cenv);
      const y = evalComplex(p, cenv);
      if (!x || !y) return neq('random-points');
      const scale = Math.max(1, Math.hypot(...x), Math.hypot(...y));
      if (!x.concat(y).every(Number.isFinite)) continue;
      if (Math.hypot(x[0] - y[0], x[1] - y[1]) > 1e-8 * scale) return neq('complex-points');
      valid++;
    }
    return valid >= Math.min(4, this.o.points) ? eqv('complex-points') : unk('complex-points-too-few-valid');
  }
}

const abs = (x: bigint) => (x < 0n ? -x : x);
const bigMax = (a: bigint, b: bigint) => (a > b ? a : b);

/**
 * PRIME's leniencies between two different integers, computed exactly (PRIME's floats lose digits past
 * 2^53): `math_equal` accepts the prediction when `isclose(x, pred, rel_tol=1e-4)` for x in gold/100,
 * gold, gold·100 (PRIME-RL/PRIME@18ad596f …/math_util/grader.py, lines 194-202). The path name, or null.
 */
export function integerLeniency(
  gold: bigint,
  pred: bigint,
  o: Pick<CompareOptions, 'relTol' | 'percentTimes100' | 'nearMissIntegers'>,
): string | null {
  if (gold === pred) return 'integer';
  // |a - b| <= relTol · max(|a|, |b|), as |a - b| · (1/relTol) <= max(|a|, |b|).
  const inv = o.nearMissIntegers && o.relTol > 0 ? BigInt(Math.round(1 / o.relTol)) : 0n;
  const close = (a: bigint, b: bigint) => a === b || (inv > 0n && abs(a - b) * inv <= bigMax(abs(a), abs(b)));
  if (close(gold, pred)) return gold === pred ? 'integer' : 'lenient-near-integer';
  // pred ≈ gold/100 is gold ≈ 100·pred with the same relative tolerance.
  if (o.percentTimes100 && (close(gold * 100n, pred) || close(gold, pred * 100n))) return 'lenient-percent';
  return null;
}

/** Equal at `d` decimals and at `d` significant digits (exactly, when both rationals are given). */
export function floatsAgree(a: number, b: number, d: number, ea?: R.Rat, eb?: R.Rat): boolean {
  const dec =
    ea && eb
      ? R.roundScaled(ea, d) === R.roundScaled(eb, d)
      : Math.round(a * 10 ** d) === Math.round(b * 10 ** d);
  return dec && Number(a.toPrecision(d)) === Number(b.toPrecision(d));
}

function isCollection(n: Node): boolean {
  return n.t === 'tuple' || n.t === 'set' || n.t === 'list' || n.t === 'matrix' || n.t === 'union';
}

/** `x = v` (or `x \in S`, or a chain `x = a = v`) with a plain variable on the left → v. */
function assignedValue(n: Extract<Node, { t: 'rel' }>): Node | null {
  if (n.parts[0].t !== 'sym') return null;
  if (n.ops.every((o) => o === '=') || (n.ops.length === 1 && n.ops[0] === 'in'))
    return n.parts.at(-1) ?? null;
  return null;
}

/** A list of assignments to distinct plain variables (`y = 1, x = 2`), by variable name; else null. */
function assignments(n: Extract<Node, { t: 'list' }>): Map<string, Node> | null {
  const out = new Map<string, Node>();
  for (const x of n.items) {
    if (x.t !== 'rel' || x.ops.length !== 1 || x.ops[0] !== '=' || x.parts[0].t !== 'sym') return null;
    if (out.has(x.parts[0].name)) return null; // `x = 1, x = 2`: two roots, a set
    out.set(x.parts[0].name, x.parts[1]);
  }
  return out;
}

/** A list of assignments as its values in the order of their names (coordinates: x before y, a before b). */
function byName(n: Node): Node[] | null {
  const m = n.t === 'list' ? assignments(n) : null;
  if (!m || m.size < 2) return null;
  return [...m.keys()].sort().map((k) => m.get(k) as Node);
}

/** `>`/`>=` chains rewritten with `<`/`<=` so `a > b` and `b < a` compare equal. */
function orient(n: Extract<Node, { t: 'rel' }>): { ops: string[]; parts: Node[] } {
  if (n.ops.every((o) => o === '>' || o === '>=')) {
    return { ops: n.ops.map((o) => (o === '>' ? '<' : '<=')).reverse(), parts: n.parts.slice().reverse() };
  }
  return { ops: n.ops, parts: n.parts };
}

/** A gold inequality in one variable as an interval: `1 < x <= 2` → (1, 2]; `1 <= |z| <= 2` → two. */
function relToInterval(n: Extract<Node, { t: 'rel' }>, isVar: (n: Node) => boolean): Node | null {
  const { ops, parts } = orient(n);
  if (!ops.every((o) => o === '<' || o === '<=')) return null;
  const open = ops.map((o) => o === '<');
  const iv = (lo: Node, hi: Node, l: boolean, r: boolean): Node => ({
    t: 'tuple',
    open: l ? '(' : '[',
    close: r ? ')' : ']',
    items: [lo, hi],
  });
  const inf: Node = { t: 'const', name: 'inf' };
  const neg = (a: Node): Node => ({ t: 'neg', a });
  const [lo, mid, hi] = parts;
  if (parts.length === 3 && mid.t === 'fn' && mid.name === 'abs' && isVar(mid.args[0])) {
    if (!(evalNum(lo, new Map()) >= 0)) return null;
    return { t: 'union', items: [iv(neg(hi), neg(lo), open[1], open[0]), iv(lo, hi, open[0], open[1])] };
  }
  if (parts.length === 3 && isVar(mid)) return iv(lo, hi, open[0], open[1]);
  if (parts.length === 2 && isVar(parts[0])) return iv(neg(inf), parts[1], true, open[0]);
  if (parts.length === 2 && isVar(parts[1])) return iv(parts[0], inf, open[0], true);
  return null;
}

/** Made only of symbols (latex2sympy's test for an assignment's left side): `x`, `AB`, `f(x)`, `(p,q)`, `A/B`. */
function onlySymbols(n: Node): boolean {
  if (n.t === 'sym') return true;
  if (n.t === 'pow') return onlySymbols(n.a) && n.b.t === 'neg' && evalExact(n.b)?.n === -1n;
  if (n.t === 'mul' || n.t === 'div' || n.t === 'tuple' || (n.t === 'fn' && n.name === 'abs')) {
    return children(n).every(onlySymbols);
  }
  return false;
}

/** `lhs = … = rhs` (or `lhs \in S`) with a left side of only symbols, as lhs and its last right side. */
function assignment(n: Extract<Node, { t: 'rel' }>): { lhs: Node; rhs: Node } | null {
  const eq = n.ops.every((o) => o === '=') || (n.ops.length === 1 && n.ops[0] === 'in');
  return eq && onlySymbols(n.parts[0]) ? { lhs: n.parts[0], rhs: n.parts.at(-1) as Node } : null;
}

/** The entries of a matrix sum or product (`A + B`, `A B`), as expressions; null for anything else. */
function matrixValue(n: Node): Node[][] | null {
  if (n.t === 'matrix') return n.rows;
  if (n.t !== 'add' && n.t !== 'mul') return null;
  let acc: Node[][] | null = null;
  for (const term of n.a) {
    const m = matrixValue(term);
    if (!m) return null;
    if (!acc) acc = m;
    else if (n.t === 'add') {
      const x: Node[][] = acc;
      if (x.length !== m.length || x[0].length !== m[0].length) return null;
      acc = x.map((row, i) => row.map((v, j): Node => ({ t: 'add', a: [v, m[i][j]] })));
    } else {
      if (acc[0].length !== m.length) return null;
      acc = acc.map((row) =>
        m[0].map((_, j): Node => ({ t: 'add', a: row.map((v, k): Node => ({ t: 'mul', a: [v, m[k][j]] })) })),
      );
    }
  }
  return acc;
}
