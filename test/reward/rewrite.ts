// Common rewritings of a gold answer that a verifier must accept, and perturbations it must reject.
import { evalExact, evalNum, freeVars } from '../../src/reward/compare.js';
import { normalise } from '../../src/reward/normalise.js';
import { parseAnswer } from '../../src/reward/parse.js';
import * as R from '../../src/reward/rational.js';

export function rewritings(a: string): { name: string; pred: string }[] {
  const out: { name: string; pred: string }[] = [];
  const add = (name: string, pred: string) => {
    if (pred !== a) out.push({ name, pred });
  };
  if (!/^\d+\s*\\frac/.test(a))
    add(
      'slash-fraction',
      a.replace(/\\d?frac\{([^{}]+)\}\{([^{}]+)\}/g, (_, x, y) => `(${x})/(${y})`),
    );
  add('dfrac', a.replace(/\\frac/g, '\\dfrac'));
  add('short-frac', a.replace(/\\frac\{(\d)\}\{(\d)\}/g, '\\frac$1$2'));
  add('short-sqrt', a.replace(/\\sqrt\{(\d)\}/g, '\\sqrt$1'));
  add('no-spaces', a.replace(/ /g, ''));
  if (!/\d,\\?!?\s?\d{3}/.test(a)) add('spaces', a.replace(/([+=,])/g, ' $1 '));
  add('left-right', a.replace(/\(/g, '\\left(').replace(/\)/g, '\\right)'));
  add('pi-unicode', a.replace(/\\pi/g, 'π'));
  add('degrees-dropped', a.replace(/\^\\circ/g, ''));
  add('thousands-dropped', /^\d{1,3}(,\d{3})+$/.test(a) ? a.replace(/,/g, '') : a);
  add('thousands-added', /^\d{5,}$/.test(a) ? Number(a).toLocaleString('en-US') : a);
  add('float-suffix', /^-?\d+$/.test(a) ? `${a}.0` : a);
  add('dollars', /^-?\d+(\.\d+)?$/.test(a) ? `\\$${a}` : a);
  add('text-unit', /^-?\d+$/.test(a) ? `${a} \\text{ units}` : a);
  add('times-cdot', a.replace(/\\cdot/g, '\\times'));
  const v = numericValue(a);
  if (v !== null && Number.isFinite(v) && Math.abs(v) < 1e9) add('decimal-10', v.toFixed(10));
  return out;
}

export function perturbations(a: string): { name: string; pred: string }[] {
  const out: { name: string; pred: string }[] = [];
  const v = numericValue(a);
  if (v !== null && Number.isFinite(v)) {
    out.push({ name: 'plus-one', pred: `(${a})+1` });
    if (Math.abs(v) > 1e-3) out.push({ name: 'decimal-off', pred: (v * 1.001).toFixed(8) });
    if (v !== 0) out.push({ name: 'negated', pred: `-(${a})` });
  }
  if (/\d/.test(a) && !/,/.test(a)) out.push({ name: 'digit-changed', pred: bumpLastDigit(a) });
  return out.filter((p) => p.pred !== a);
}

function bumpLastDigit(a: string): string {
  const m = /(\d)(\D*)$/.exec(a);
  if (!m || m.index === undefined) return a;
  const d = (Number(m[1]) + 1) % 10;
  return `${a.slice(0, m.index)}${d}${m[2]}`;
}

/** The value of a variable-free scalar answer, or null. */
export function numericValue(a: string): number | null {
  try {
    const n = parseAnswer(normalise(a).text);
    if (['list', 'set', 'tuple', 'matrix', 'rel', 'union', 'text', 'pm'].includes(n.t)) return null;
    if (freeVars(n).size > 0) return null;
    const e = evalExact(n);
    return e ? R.toNumber(e) : evalNum(n, new Map());
  } catch {
    return null;
  }
}
