import { casValue } from './cas.js';
import { type CompareOptions, Comparer, evalNum, floatsAgree, freeVars, Timeout } from './compare.js';
import { extractAnswer, extractGold } from './extract.js';
import { normalise } from './normalise.js';
import { type Node, ParseError, parseAnswer } from './parse.js';
import type { VerifyOptions, VerifyProfile, VerifyResult } from './types.js';

export const DEFAULTS = {
  profile: 'strict' as VerifyProfile,
  timeoutMs: 1000,
  maxInputChars: 200_000,
  maxAnswerChars: 1000,
  seed: 1234,
};

/** The named profiles. `strict` is the default reward; `lenient` adds the reference PRIME grader's leniencies. */
const DEFAULT_FLOAT_ROUNDING = 6;

export const PROFILES: Record<VerifyProfile, Omit<CompareOptions, 'seed' | 'deadline'>> = {
  strict: {
    floatRounding: 6,
    relTol: 0,
    percentTimes100: false,
    piAs314: false,
    percentAsUnit: true,
    points: 12,
  },
  lenient: {
    floatRounding: 6,
    relTol: 1e-4,
    percentTimes100: true,
    piAs314: true,
    percentAsUnit: true,
    points: 12,
  },
};

const INT = /^\s*[-+]?\d+\s*$/;

function parse(s: string): Node | string {
  try {
    return parseAnswer(s);
  } catch (e) {
    // A RangeError from absurd nesting is as much "does not parse" as a syntax error.
    if (e instanceof ParseError || e instanceof RangeError) return e.message;
    throw e;
  }
}

function squash(s: string): string {
  return s.replace(/\s+/g, '');
}

/** Compares a model response (or a bare answer with `extract: false`) against a gold answer. */
export function verify(pred: string, gold: string, opts: VerifyOptions = {}): VerifyResult {
  const profile = opts.profile ?? DEFAULTS.profile;
  if (!(profile in PROFILES))
    throw new Error(`unknown verify profile ${JSON.stringify(profile)} (strict|lenient)`);
  if (typeof pred !== 'string' || typeof gold !== 'string')
    throw new Error('verify: pred and gold must be strings');
  const maxIn = opts.maxInputChars ?? DEFAULTS.maxInputChars;
  const maxAns = opts.maxAnswerChars ?? DEFAULTS.maxAnswerChars;
  const notes: string[] = [];
  let text = pred;
  if (text.length > maxIn) {
    text = text.slice(text.length - maxIn);
    notes.push(`prediction truncated to its last ${maxIn} chars`);
  }
  const base = { extracted: null, normalised: null, matchedBy: null, source: null, goldNormalised: null };
  const ex = opts.extract === false ? { answer: text.trim(), source: 'whole' } : extractAnswer(text);
  if (!ex || ex.answer === '') {
    return {
      ...base,
      correct: false,
      status: 'no-answer',
      reason: join('no answer found in prediction', notes),
    };
  }
  const withEx = { ...base, extracted: ex.answer, source: ex.source };
  if (ex.answer.length > maxAns) {
    return {
      ...withEx,
      correct: false,
      status: 'not-equal',
      reason: join(`extracted answer longer than ${maxAns} chars`, notes),
    };
  }
  const goldAns = extractGold(gold);
  if (goldAns.length > maxAns * 10) throw new Error(`gold answer longer than ${maxAns * 10} chars`);

  // Fast path: two integers need no normalisation or parsing.
  if (INT.test(ex.answer) && INT.test(goldAns)) {
    const a = BigInt(ex.answer.trim());
    const b = BigInt(goldAns.trim());
    const ok = a === b;
    return {
      ...withEx,
      normalised: a.toString(),
      goldNormalised: b.toString(),
      correct: ok,
      status: ok ? 'equal' : 'not-equal',
      matchedBy: ok ? 'integer' : null,
      reason: join(ok ? 'equal integers' : `integer ${a} != ${b}`, notes),
    };
  }

  const bp = numberBase(ex.answer);
  const bg = numberBase(goldAns);
  if (bp !== null && bg !== null && bp !== bg) {
    return {
      ...withEx,
      correct: false,
      status: 'not-equal',
      reason: join(`number base ${bp} != ${bg}`, notes),
    };
  }
  const np = normalise(ex.answer);
  const ng = normalise(goldAns);
  const res = { ...withEx, normalised: np.text, goldNormalised: ng.text };
  if (np.text === '')
    return {
      ...res,
      correct: false,
      status: 'no-answer',
      reason: join('answer empty after normalisation', notes),
    };
  if (squash(np.text) === squash(ng.text)) {
    return {
      ...res,
      correct: true,
      status: 'equal',
      matchedBy: 'string',
      reason: join('identical after normalisation', notes),
    };
  }
  const g = parse(ng.text);
  const p = parse(np.text);
  if (typeof g === 'string' || typeof p === 'string') {
    const which = typeof g === 'string' ? `gold does not parse (${g})` : `answer does not parse (${p})`;
    const byCas = casCompare(ng.text, g, np.text, p, PROFILES[profile].relTol);
    if (byCas === true) {
      return {
        ...res,
        correct: true,
        status: 'equal',
        matchedBy: 'cas-numeric',
        reason: join('equal by cas-numeric', notes),
      };
    }
    if (byCas === false) {
      return { ...res, correct: false, status: 'not-equal', reason: join('not-equal (cas-numeric)', notes) };
    }
    return { ...res, correct: false, status: 'unknown', reason: join(which, notes) };
  }
  const cmp = new Comparer({
    ...PROFILES[profile],
    seed: opts.seed ?? DEFAULTS.seed,
    deadline: Date.now() + (opts.timeoutMs ?? DEFAULTS.timeoutMs),
  });
  try {
    const out = cmp.compare(g, p);
    const ok = out.verdict === 'equal';
    return {
      ...res,
      correct: ok,
      status: out.verdict,
      matchedBy: ok ? out.by : null,
      reason: join(ok ? `equal by ${out.by}` : `${out.verdict} (${out.by})`, notes),
    };
  } catch (e) {
    if (e instanceof Timeout) {
      return { ...res, correct: false, status: 'timeout', reason: join('time limit reached', notes) };
    }
    return { ...res, correct: false, status: 'error', reason: join(`error: ${(e as Error).message}`, notes) };
  }
}

// Our value of a parsed, variable-free scalar, else the CAS's value of the text.
function scalarValue(text: string, parsed: Node | string): number | null {
  if (typeof parsed !== 'string') {
    if (!['num', 'neg', 'add', 'mul', 'div', 'pow', 'fn', 'const', 'pct'].includes(parsed.t)) return null;
    if (freeVars(parsed).size > 0) return null;
    const v = evalNum(parsed, new Map());
    return Number.isFinite(v) ? v : null;
  }
  return casValue(text);
}

// Numbers only, with the same float rule as the main path; null = cannot say.
function casCompare(
  gt: string,
  g: Node | string,
  pt: string,
  p: Node | string,
  relTol: number,
): boolean | null {
  const a = scalarValue(gt, g);
  const b = scalarValue(pt, p);
  if (a === null || b === null) return null;
  if (/\d\.\d|\.\d/.test(gt) || /\d\.\d|\.\d/.test(pt)) return floatsAgree(a, b, DEFAULT_FLOAT_ROUNDING);
  const tol = Math.max(relTol, 1e-10);
  return Math.abs(a - b) <= tol * Math.max(1, Math.abs(a), Math.abs(b));
}

// The base-subscript rule drops `_b` from `204_5`; two answers that both state a base must state the same.
function numberBase(s: string): string | null {
  const m = /\d_\{?(\d+)\}?/.exec(s);
  return m ? m[1] : null;
}

function join(reason: string, notes: string[]): string {
  return notes.length ? `${reason}; ${notes.join('; ')}` : reason;
}

/** The trainer's and eval's entry point: a whole trajectory text scored against a gold answer. */
export function scoreTrajectoryText(
  text: string,
  gold: string,
  profile: VerifyProfile = 'strict',
): VerifyResult {
  return verify(text, gold, { profile });
}
