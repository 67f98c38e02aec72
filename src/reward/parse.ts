// A small LaTeX / plain-math parser into a value tree that the comparer understands: numbers (exact
// rationals), symbols, arithmetic, functions, tuples/intervals, sets, matrices, relations and `\pm`.
// It is deliberately forgiving about malformed-but-common LaTeX (`\frac12`, `\sqrt3`, `sqrt(2)`).

import { parseDecimal, type Rat } from './rational.js';

export type Node =
  | { t: 'num'; v: Rat; float: boolean }
  | { t: 'sym'; name: string }
  | { t: 'const'; name: 'pi' | 'e' | 'inf' }
  | { t: 'add'; a: Node[] }
  | { t: 'neg'; a: Node }
  | { t: 'mul'; a: Node[] }
  | { t: 'div'; a: Node; b: Node }
  | { t: 'pow'; a: Node; b: Node }
  | { t: 'fn'; name: string; args: Node[] }
  | { t: 'pct'; a: Node }
  | { t: 'pm'; a: Node; b: Node; sign: 1 | -1 } // a ± b; sign -1 for \mp
  | { t: 'tuple'; open: '(' | '['; close: ')' | ']'; items: Node[] }
  | { t: 'set'; items: Node[] }
  | { t: 'list'; items: Node[] }
  | { t: 'matrix'; rows: Node[][] }
  | { t: 'rel'; ops: string[]; parts: Node[] }
  | { t: 'union'; items: Node[] }
  | { t: 'text'; s: string };

export class ParseError extends Error {}

type Tok = { k: 'num' | 'id' | 'cmd' | 'op' | 'matbegin' | 'matend' | 'end'; v: string };

const FN_WORDS = /^(sqrt|sin|cos|tan|sec|csc|cot|arcsin|arccos|arctan|log|ln|exp|sinh|cosh|tanh)(?=\s*\()/;
const FUNCS = new Set([
  'sin',
  'cos',
  'tan',
  'sec',
  'csc',
  'cot',
  'arcsin',
  'arccos',
  'arctan',
  'sinh',
  'cosh',
  'tanh',
  'log',
  'ln',
  'lg',
  'exp',
]);
const GREEK = new Set(
  'alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi rho sigma tau upsilon phi varphi chi psi omega Gamma Delta Theta Lambda Xi Sigma Phi Psi Omega'.split(
    ' ',
  ),
);

export function tokenize(s: string): Tok[] {
  const out: Tok[] = [];
  let i = 0;
  while (i < s.length) {
    const c = s[i];
    if (/\s/.test(c)) {
      i++;
      continue;
    }
    const rest = s.slice(i);
    let m = /^(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+(?![a-zA-Z]))?/.exec(rest);
    if (m) {
      out.push({ k: 'num', v: m[0] });
      i += m[0].length;
      continue;
    }
    m = /^\\begin\{(?:[pbvBV]?matrix|array)\}(?:\{[^}]*\})?/.exec(rest);
    if (m) {
      out.push({ k: 'matbegin', v: m[0] });
      i += m[0].length;
      continue;
    }
    m = /^\\end\{(?:[pbvBV]?matrix|array)\}/.exec(rest);
    if (m) {
      out.push({ k: 'matend', v: m[0] });
      i += m[0].length;
      continue;
    }
    m = /^\\(?:[a-zA-Z]+|[{}|\\%])/.exec(rest);
    if (m) {
      out.push({ k: 'cmd', v: m[0] });
      i += m[0].length;
      continue;
    }
    m = FN_WORDS.exec(rest) ?? /^pi(?![a-zA-Z])/.exec(rest);
    if (m) {
      out.push({ k: 'cmd', v: `\\${m[0]}` });
      i += m[0].length;
      continue;
    }
    if (/[a-zA-Z]/.test(c)) {
      out.push({ k: 'id', v: c });
      i++;
      continue;
    }
    m = /^(?:<=|>=|!=|\*\*|=<|=>)/.exec(rest);
    if (m) {
      const v = m[0] === '**' ? '^' : m[0] === '=<' ? '<=' : m[0] === '=>' ? '>=' : m[0];
      out.push({ k: 'op', v });
      i += 2;
      continue;
    }
    if ("+-*/^_()[]{},;|!=<>%&'".includes(c)) {
      out.push({ k: 'op', v: c });
      i++;
      continue;
    }
    throw new ParseError(`unexpected character ${JSON.stringify(c)}`);
  }
  out.push({ k: 'end', v: '' });
  return out;
}

const REL_OPS = new Set(['=', '<', '>', '<=', '>=', '!=', '\\in']);

class Parser {
  private i = 0;
  private absDepth = 0;
  constructor(private readonly toks: Tok[]) {}

  private peek(): Tok {
    return this.toks[this.i];
  }
  private next(): Tok {
    return this.toks[this.i++];
  }
  private is(v: string): boolean {
    const t = this.peek();
    return (t.k === 'op' || t.k === 'cmd') && t.v === v;
  }
  private accept(v: string): boolean {
    if (this.is(v)) {
      this.i++;
      return true;
    }
    return false;
  }
  private expect(v: string): void {
    if (!this.accept(v)) throw new ParseError(`expected ${v}, got ${this.peek().v || 'end of input'}`);
  }

  top(): Node {
    const n = this.list(new Set());
    if (this.peek().k !== 'end') throw new ParseError(`unexpected ${this.peek().v}`);
    return n;
  }

  // Comma/semicolon separated items; a single item is returned as itself.
  private list(closers: Set<string>): Node {
    const items: Node[] = [];
    if (this.atCloser(closers)) return { t: 'list', items };
    items.push(this.rel());
    while (this.accept(',') || this.accept(';')) {
      while (this.accept(',') || this.accept(';')); // `3, 5,, 7` after "and" → ","
      if (this.atCloser(closers)) break; // trailing comma
      items.push(this.rel());
    }
    return items.length === 1 ? items[0] : { t: 'list', items };
  }

  private atCloser(closers: Set<string>): boolean {
    const t = this.peek();
    return t.k === 'end' || ((t.k === 'op' || t.k === 'cmd') && closers.has(t.v));
  }

  private rel(): Node {
    const parts = [this.union()];
    const ops: string[] = [];
    for (;;) {
      const t = this.peek();
      if ((t.k === 'op' || t.k === 'cmd') && REL_OPS.has(t.v)) {
        this.i++;
        ops.push(t.v === '\\in' ? 'in' : t.v);
        parts.push(this.union());
      } else break;
    }
    return ops.length === 0 ? parts[0] : { t: 'rel', ops, parts };
  }

  private union(): Node {
    const items = [this.expr()];
    while (this.accept('\\cup')) items.push(this.expr());
    return items.length === 1 ? items[0] : { t: 'union', items };
  }

  private expr(): Node {
    let acc: Node;
    if (this.is('\\pm') || this.is('\\mp')) acc = { t: 'num', v: { n: 0n, d: 1n }, float: false };
    else acc = this.term();
    for (;;) {
      if (this.accept('+')) acc = addNode(acc, this.term());
      else if (this.accept('-')) acc = addNode(acc, { t: 'neg', a: this.term() });
      else if (this.is('\\pm') || this.is('\\mp')) {
        const sign = this.next().v === '\\pm' ? 1 : -1;
        acc = { t: 'pm', a: acc, b: this.term(), sign };
      } else return acc;
    }
  }

  private term(): Node {
    const factors: Node[] = [this.unary()];
    for (;;) {
      if (this.accept('*') || this.accept('\\cdot') || this.accept('\\times') || this.accept('\\ast')) {
        factors.push(this.unary());
      } else if (this.accept('/') || this.accept('\\div')) {
        const a: Node = factors.length === 1 ? factors[0] : { t: 'mul', a: factors.splice(0) };
        factors.length = 0;
        factors.push({ t: 'div', a, b: this.unary() });
      } else if (this.startsAtom()) {
        factors.push(this.postfix());
      } else break;
    }
    return factors.length === 1 ? factors[0] : { t: 'mul', a: factors };
  }

  private startsAtom(): boolean {
    const t = this.peek();
    if (t.k === 'num' || t.k === 'id' || t.k === 'matbegin') return true;
    if (t.k === 'op') return t.v === '(' || t.v === '{' || (t.v === '|' && this.absDepth === 0);
    if (t.k === 'cmd') {
      return ![
        '\\cdot',
        '\\times',
        '\\div',
        '\\pm',
        '\\mp',
        '\\cup',
        '\\in',
        '\\}',
        '\\\\',
        '\\ast',
      ].includes(t.v);
    }
    return false;
  }

  private unary(): Node {
    if (this.accept('-')) return { t: 'neg', a: this.unary() };
    if (this.accept('+')) return this.unary();
    return this.postfix();
  }

  private postfix(): Node {
    let base = this.atom();
    for (;;) {
      if (this.accept('^')) base = { t: 'pow', a: base, b: this.powArg() };
      else if (this.accept('!')) base = { t: 'fn', name: 'fact', args: [base] };
      else if (this.accept('%') || this.accept('\\%')) base = { t: 'pct', a: base };
      else return base;
    }
  }

  private powArg(): Node {
    if (this.is('{')) return this.group();
    if (this.accept('-')) return { t: 'neg', a: this.powArg() };
    const t = this.peek();
    if (t.k === 'num' && t.v.length > 1 && /^\d+$/.test(t.v)) {
      // `2^10` in LaTeX is 2^1 followed by 0; models mean 2^{10}, so plain digits stay together.
      this.i++;
      return num(t.v);
    }
    return this.atom();
  }

  // `{…}` group, or a single token: the argument form of \frac, \sqrt, ^.
  private arg(): Node {
    if (this.is('{')) return this.group();
    const t = this.peek();
    if (t.k === 'num') {
      this.i++;
      // `\frac12`: a malformed argument is one digit, the rest belongs to what follows.
      if (t.v.length > 1 && /^\d+$/.test(t.v)) {
        this.toks.splice(this.i, 0, { k: 'num', v: t.v.slice(1) });
        return num(t.v[0]);
      }
      return num(t.v);
    }
    return this.atom();
  }

  private group(): Node {
    this.expect('{');
    const inner = this.list(new Set(['}']));
    this.expect('}');
    if (inner.t === 'list') return { t: 'set', items: inner.items };
    return inner;
  }

  private atom(): Node {
    const t = this.next();
    if (t.k === 'num') return num(t.v);
    if (t.k === 'id') {
      if (t.v === 'e') return { t: 'const', name: 'e' };
      return this.subscripted(t.v);
    }
    if (t.k === 'matbegin') return this.matrix();
    if (t.k === 'op') {
      if (t.v === '(' || t.v === '[') return this.bracketed(t.v);
      if (t.v === '{') {
        this.i--;
        return this.group();
      }
      if (t.v === '|') {
        this.absDepth++;
        const inner = this.expr();
        this.absDepth--;
        this.expect('|');
        return { t: 'fn', name: 'abs', args: [inner] };
      }
    }
    if (t.k === 'cmd') return this.command(t.v);
    throw new ParseError(`unexpected ${t.v || 'end of input'}`);
  }

  private subscripted(name: string): Node {
    if (this.accept('_')) {
      const sub = this.is('{') ? this.group() : this.atom();
      return { t: 'sym', name: `${name}_${show(sub)}` };
    }
    return { t: 'sym', name };
  }

  private bracketed(open: '(' | '['): Node {
    const inner = this.list(new Set([')', ']']));
    const close = this.next();
    if (close.v !== ')' && close.v !== ']') throw new ParseError(`unclosed ${open}`);
    if (inner.t === 'list') return { t: 'tuple', open, close: close.v as ')' | ']', items: inner.items };
    if (open === '(' && close.v === ')') return inner;
    if (open === '[' && close.v === ']') return inner; // `[x]` as grouping
    throw new ParseError(`mismatched brackets ${open}${close.v}`);
  }

  private matrix(): Node {
    const rows: Node[][] = [[]];
    for (;;) {
      const t = this.peek();
      if (t.k === 'matend') {
        this.i++;
        break;
      }
      if (t.k === 'end') throw new ParseError('unclosed matrix');
      if (this.accept('\\\\')) {
        rows.push([]);
        continue;
      }
      if (this.accept('&')) continue;
      rows[rows.length - 1].push(this.rel());
    }
    while (rows.length > 0 && rows[rows.length - 1].length === 0) rows.pop();
    if (rows.length === 0 || rows.some((r) => r.length !== rows[0].length))
      throw new ParseError('ragged matrix');
    return { t: 'matrix', rows };
  }

  private command(c: string): Node {
    const name = c.slice(1);
    switch (name) {
      case 'frac': {
        const a = this.arg();
        return { t: 'div', a, b: this.arg() };
      }
      case 'sqrt': {
        if (this.accept('[')) {
          const idx = this.expr();
          this.expect(']');
          return { t: 'pow', a: this.arg(), b: { t: 'div', a: num('1'), b: idx } };
        }
        return { t: 'fn', name: 'sqrt', args: [this.arg()] };
      }
      case 'binom':
      case 'dbinom':
      case 'tbinom': {
        const a = this.arg();
        return { t: 'fn', name: 'binom', args: [a, this.arg()] };
      }
      case 'pi':
        return { t: 'const', name: 'pi' };
      case 'infty':
        return { t: 'const', name: 'inf' };
      case '{': {
        const inner = this.list(new Set(['\\}']));
        this.expect('\\}');
        return { t: 'set', items: inner.t === 'list' ? inner.items : [inner] };
      }
      case '|':
        return this.atomAbs('\\|');
      case 'lfloor':
      case 'lceil': {
        const inner = this.expr();
        this.expect(name === 'lfloor' ? '\\rfloor' : '\\rceil');
        return { t: 'fn', name: name === 'lfloor' ? 'floor' : 'ceil', args: [inner] };
      }
      case 'text':
      case 'mbox':
      case 'mathrm':
      case 'textbf':
        return this.arg();
    }
    if (GREEK.has(name)) return this.subscripted(name);
    if (FUNCS.has(name)) return this.func(name);
    throw new ParseError(`unsupported command ${c}`);
  }

  private atomAbs(close: string): Node {
    const inner = this.expr();
    this.expect(close);
    return { t: 'fn', name: 'abs', args: [inner] };
  }

  private func(name: string): Node {
    let power: Node | null = null;
    let base: Node | null = null;
    if (this.accept('_')) base = this.is('{') ? this.group() : this.arg();
    if (this.accept('^')) {
      const p = this.powArg();
      // `\sin^{-1}` is arcsin, not 1/sin.
      if (
        p.t === 'neg' &&
        p.a.t === 'num' &&
        p.a.v.n === 1n &&
        p.a.v.d === 1n &&
        /^(sin|cos|tan)$/.test(name)
      ) {
        name = `arc${name}`;
      } else power = p;
    }
    let a: Node;
    if (this.is('(')) {
      this.i++;
      a = this.list(new Set([')']));
      this.expect(')');
    } else a = this.postfix();
    let out: Node;
    if (name === 'log' && base) out = { t: 'div', a: { t: 'fn', name: 'ln', args: [a] }, b: fnLn(base) };
    else out = { t: 'fn', name: name === 'lg' ? 'log' : name, args: [a] };
    return power ? { t: 'pow', a: out, b: power } : out;
  }
}

function fnLn(x: Node): Node {
  return { t: 'fn', name: 'ln', args: [x] };
}

function num(s: string): Node {
  const v = parseDecimal(s);
  if (!v) throw new ParseError(`bad number ${s}`);
  return { t: 'num', v, float: /[.eE]/.test(s) };
}

function addNode(a: Node, b: Node): Node {
  return a.t === 'add' ? { t: 'add', a: [...a.a, b] } : { t: 'add', a: [a, b] };
}

/** A compact text form, used for subscript names and for reasons. */
export function show(n: Node): string {
  switch (n.t) {
    case 'num':
      return n.v.d === 1n ? n.v.n.toString() : `${n.v.n}/${n.v.d}`;
    case 'sym':
      return n.name;
    case 'const':
      return n.name;
    case 'add':
      return n.a.map(show).join('+');
    case 'neg':
      return `-(${show(n.a)})`;
    case 'mul':
      return n.a.map((x) => (x.t === 'add' ? `(${show(x)})` : show(x))).join('*');
    case 'div':
      return `(${show(n.a)})/(${show(n.b)})`;
    case 'pow':
      return `(${show(n.a)})^(${show(n.b)})`;
    case 'fn':
      return `${n.name}(${n.args.map(show).join(',')})`;
    case 'pct':
      return `${show(n.a)}%`;
    case 'pm':
      return `${show(n.a)}${n.sign > 0 ? '±' : '∓'}${show(n.b)}`;
    case 'tuple':
      return `${n.open}${n.items.map(show).join(',')}${n.close}`;
    case 'set':
      return `{${n.items.map(show).join(',')}}`;
    case 'list':
      return n.items.map(show).join(',');
    case 'matrix':
      return `[${n.rows.map((r) => r.map(show).join(',')).join(';')}]`;
    case 'rel':
      return n.parts.map((p, i) => (i === 0 ? show(p) : `${n.ops[i - 1]}${show(p)}`)).join('');
    case 'union':
      return n.items.map(show).join('∪');
    case 'text':
      return JSON.stringify(n.s);
  }
}

// Whole answers made of words (`\text{Evelyn}` → `Evelyn`, `odd`, `east`) are compared as text.
const WORDS = /^[A-Za-z][A-Za-z' ]*$/;

export function parseAnswer(s: string): Node {
  const trimmed = s.trim();
  if (WORDS.test(trimmed) && trimmed.split(/\s+/).some((w) => w.length >= 2)) {
    return { t: 'text', s: trimmed.toLowerCase().replace(/\s+/g, ' ') };
  }
  return new Parser(tokenize(trimmed)).top();
}
