import { casLoadError, casValue } from './cas.js';
import {
  type CompareOptions,
  Comparer,
  evalNum,
  floatsAgree,
  freeVars,
  integerLeniency,
  Timeout,
} from './compare.js';
import {
  type Extracted,
  extractAnswer,
  extractGold,
  extractPrime,
  extractReference,
  extractReferenceGold,
} from './extract.js';
import { normalise, REFERENCE_RULES, RULES } from './normalise.js';
import { type Node, ParseError, parseAnswer } from './parse.js';
import type { VerifyOptions, VerifyProfile, VerifyResult } from './types.js';

export const DEFAULTS = {
  profile: 'strict' as VerifyProfile,
  timeoutMs: 1000,
  maxInputChars: 200_000,
  maxAnswerChars: 1000,
  seed: 1234,
};

export const PROFILE_NAMES: readonly VerifyProfile[] = ['integer', 'strict', 'lenient', 'reference'];

const KNOWN = new Set<unknown>(PROFILE_NAMES);

/** Throws the error every entry point gives for a profile name that does not exist. */
export function checkProfile(name: unknown): VerifyProfile {
  if (!KNOWN.has(name)) {
    throw new Error(`unknown verify profile ${JSON.stringify(name)} (valid: ${PROFILE_NAMES.join(', ')})`);
  }
  return name as VerifyProfile;
}

// strict plus the reference PRIME grader's leniencies
const LENIENT = {
  floatRounding: 6,
  relTol: 1e-4,
  percentTimes100: true,
  nearMissIntegers: true,
  piAs314: true,
  percentAsUnit: true,
  points: 12,
  mathVerify: false,
};

/**
 * The comparison settings of the named profiles (`integer` compares boxed integers only and has none).
 * `strict` is the default reward; `lenient` adds the reference PRIME grader's leniencies; `reference` is
 * PRIME's leniencies plus Math-Verify's extraction and readings, i.e. what rStar2's "PRIME or
 * Math-Verify" reward accepts.
 */
export const PROFILES: Record<
  Exclude<VerifyProfile, 'integer'>,
  Omit<CompareOptions, 'seed' | 'deadline'>
> = {
  strict: {
    floatRounding: 6,
    relTol: 0,
    percentTimes100: false,
    nearMissIntegers: false,
    piAs314: false,
    percentAsUnit: true,
    points: 12,
    mathVerify: false,
  },
  lenient: LENIENT,
  reference: { ...LENIENT, mathVerify: true }, // PRIME's leniencies OR Math-Verify
};

const NOTHING = { extracted: null, normalised: null, matchedBy: null, source: null, goldNormalised: null };

const REFERENCE_PIPELINE = [...REFERENCE_RULES, ...RULES];

const INT = /^\s*[-+]?\d+\s*$/;

function parse(s: string, lastEquation = false): Node | string {
  try {
    return parseAnswer(s);
  } catch (e) {
    // A RangeError from absurd nesting is as much "does not parse" as a syntax error.
    if (!(e instanceof ParseError || e instanceof RangeError)) throw e;
    // Math-Verify's fallback: an unparsable chain `a = b = c` (no list) is read as its last part.
    const parts = s.split(/(?<![<>!])=/);
    if (lastEquation && parts.length > 2 && !/[,;]/.test(s)) return parse(parts.at(-1) as string);
    return e.message;
  }
}

function squash(s: string): string {
  return s.replace(/\s+/g, '');
}

/** Compares a model response (or a bare answer with `extract: false`) against a gold answer. */
export function verify(pred: string, gold: string, opts: VerifyOptions = {}): VerifyResult {
  const profile = checkProfile(opts.profile ?? DEFAULTS.profile);
  if (typeof pred !== 'string' || typeof gold !== 'string')
    throw new Error('verify: pred and gold must be strings');
  const maxIn = opts.maxInputChars ?? DEFAULTS.maxInputChars;
  const notes: string[] = [];
  let text = pred;
  if (text.length > maxIn) {
    text = text.slice(text.length - maxIn);
    notes.push(`prediction truncated to its last ${maxIn} chars`);
  }
  if (profile === 'integer') return verifyInteger(text, gold, opts.extract !== false, notes);
  const reference = profile === 'reference';
  const ex: Extracted | null =
    opts.extract === false
      ? { answer: text.trim(), source: 'whole' }
      : reference
        ? extractReference(text, opts.targets)
        : extractAnswer(text);
  const deadline = Date.now() + (opts.timeoutMs ?? DEFAULTS.timeoutMs);
  const r: VerifyResult =
    ex && ex.answer !== ''
      ? check(ex, gold, profile, opts, notes, deadline)
      : {
          ...NOTHING,
          correct: false,
          status: 'no-answer',
          reason: join('no answer found in prediction', notes),
        };
  // The reference reward is PRIME or Math-Verify, and PRIME reads the response its own way: the last
  // \boxed{} alone (Math-Verify may join earlier boxes), the text after "is" or "=", or the whole text
  // where Math-Verify finds no math environment or number (`(x-2)(x+2)`, `\frac34i`).
  if (reference && !r.correct && opts.extract !== false && r.status !== 'timeout') {
    const answer = extractPrime(text);
    // An integer gold cannot equal a reading without a digit (`what we get`), which is not worth a check.
    const hopeless = !/\d/.test(answer) && INT.test(gold);
    if (answer !== '' && answer !== ex?.answer && !hopeless) {
      const prime = check({ answer, source: 'prime' }, gold, profile, opts, notes, deadline);
      if (prime.correct) return { ...prime, reason: `${prime.reason} (PRIME's reading)` };
    }
  }
  return r;
}

// Everything after extraction: the gold, normalisation, parsing and comparison.
function check(
  ex: Extracted,
  gold: string,
  profile: Exclude<VerifyProfile, 'integer'>,
  opts: VerifyOptions,
  notes: string[],
  deadline: number,
): VerifyResult {
  const reference = profile === 'reference';
  const maxAns = opts.maxAnswerChars ?? DEFAULTS.maxAnswerChars;
  const withEx = { ...NOTHING, extracted: ex.answer, source: ex.source };
  if (ex.answer.length > maxAns) {
    return {
      ...withEx,
      correct: false,
      status: 'not-equal',
      reason: join(`extracted answer longer than ${maxAns} chars`, notes),
    };
  }
  const goldAns = reference ? extractReferenceGold(gold, opts.targets) : extractGold(gold);
  if (goldAns.length > maxAns * 10) throw new Error(`gold answer longer than ${maxAns * 10} chars`);

  let settings =
    opts.leniencies === undefined ? PROFILES[profile] : { ...PROFILES[profile], ...leniencies(opts) };
  // Fast path: two integers need no normalisation or parsing.
  if (INT.test(ex.answer) && INT.test(goldAns)) {
    const a = BigInt(ex.answer.trim());
    const b = BigInt(goldAns.trim());
    const by = integerLeniency(b, a, settings);
    return {
      ...withEx,
      normalised: a.toString(),
      goldNormalised: b.toString(),
      correct: by !== null,
      status: by ? 'equal' : 'not-equal',
      matchedBy: by,
      reason: join(
        by === 'integer' ? 'equal integers' : by ? `equal by ${by}` : `integer ${a} != ${b}`,
        notes,
      ),
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
  // PRIME drops a base (`1112112_3` → 1112112) before its tolerance, which then accepts `1112122_3`; digits
  // in another base are no decimal magnitude, so with a base stated the integers stay exact.
  if (bp !== null || bg !== null) settings = { ...settings, nearMissIntegers: false, percentTimes100: false };
  const rules = reference ? REFERENCE_PIPELINE : RULES;
  const np = normalise(ex.answer, rules);
  const ng = normalise(goldAns, rules);
  const res = { ...withEx, normalised: np.text, goldNormalised: ng.text };
  const floatRounding = opts.floatRounding ?? settings.floatRounding;
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
  const g = parse(ng.text, reference);
  const p = parse(np.text, reference);
  if (typeof g === 'string' || typeof p === 'string') {
    const which = typeof g === 'string' ? `gold does not parse (${g})` : `answer does not parse (${p})`;
    const byCas = casCompare(ng.text, g, np.text, p, settings.relTol, floatRounding);
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
    const casErr = casLoadError();
    const why = casErr ? `${which}; CAS unavailable: ${casErr}` : which;
    return { ...res, correct: false, status: 'unknown', reason: join(why, notes) };
  }
  const cmp = new Comparer({
    ...settings,
    floatRounding,
    seed: opts.seed ?? DEFAULTS.seed,
    deadline,
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
  floatRounding: number,
): boolean | null {
  const a = scalarValue(gt, g);
  const b = scalarValue(pt, p);
  if (a === null || b === null) return null;
  if (/\d\.\d|\.\d/.test(gt) || /\d\.\d|\.\d/.test(pt)) return floatsAgree(a, b, floatRounding);
  const tol = Math.max(relTol, 1e-10);
  return Math.abs(a - b) <= tol * Math.max(1, Math.abs(a), Math.abs(b));
}

// The base-subscript rule drops `_b` from `204_5`; two answers that both state a base must state the same.
function numberBase(s: string): string | null {
  const m = /\d_\{?(\d+)\}?/.exec(s);
  return m ? m[1] : null;
}

const LENIENCY_NAMES = ['percentTimes100', 'nearMissIntegers', 'piAs314'] as const;

// The caller's switches for PRIME's leniencies, checked: an unknown name or a non-boolean is an error.
function leniencies(opts: VerifyOptions): Partial<CompareOptions> {
  const l = opts.leniencies;
  if (l === undefined) return {};
  if (typeof l !== 'object' || l === null) throw new Error('verify: leniencies must be an object');
  for (const [k, v] of Object.entries(l)) {
    if (!(LENIENCY_NAMES as readonly string[]).includes(k))
      throw new Error(`verify: unknown leniency ${JSON.stringify(k)} (valid: ${LENIENCY_NAMES.join(', ')})`);
    if (typeof v !== 'boolean') throw new Error(`verify: leniency ${k} must be true or false`);
  }
  return l;
}

function join(reason: string, notes: string[]): string {
  return notes.length ? `${reason}; ${notes.join('; ')}` : reason;
}

// The integer profile (the quickstart's reward): only a \boxed{} answer counts, compared as an integer
// after dropping spaces, commas, `$` and a `\text{}` wrapper. The fallbacks (last number, ...) would credit
// a copied tool stdout that the model never turned into an answer.
function asInteger(s: string): string | null {
  const t = s.replace(/[\s,$]/g, '').replace(/^\\text\{(.*)\}$/, '$1');
  return /^[-+]?\d+$/.test(t) ? BigInt(t).toString() : null;
}

function verifyInteger(text: string, gold: string, extract: boolean, notes: string[]): VerifyResult {
  const ex: Extracted | null = extract ? extractAnswer(text) : { answer: text.trim(), source: 'whole' };
  const want = asInteger(gold);
  const got = ex && (ex.source === 'boxed' || !extract) ? asInteger(ex.answer) : null;
  const correct = got !== null && got === want;
  const why = !ex
    ? 'no answer found in prediction'
    : got === null
      ? extract && ex.source !== 'boxed'
        ? `only a \\boxed{} answer counts (found ${ex.source})`
        : 'boxed answer is not an integer'
      : want === null
        ? 'gold is not an integer'
        : correct
          ? 'equal integers'
          : `integer ${got} != ${want}`;
  return {
    correct,
    extracted: ex?.answer ?? null,
    normalised: got,
    goldNormalised: want,
    matchedBy: correct ? 'integer' : null,
    source: ex?.source ?? null,
    status: correct ? 'equal' : !ex || (extract && ex.source !== 'boxed') ? 'no-answer' : 'not-equal',
    reason: join(why, notes),
  };
}

/** What train, eval and rollout record for one trajectory. */
export interface Scored {
  reward: number;
  correct: boolean;
  extracted: string | null;
  matchedBy: string | null;
  reason: string;
  /** The check ran out of time (scored 0 like any wrong answer; callers count and report it). */
  timedOut?: true;
  /** A reward module's extra RoC penalty for this response. */
  penalty?: number;
  /** The check failed (a verifier crash, a reward module that threw): scored 0, said by the caller. */
  errored?: true;
}

/** A trajectory that ended in an error (engine or tool failure) scores 0 whatever its text says. */
export function erroredScore(t: { finish?: string }): Scored | null {
  if (t.finish !== 'error') return null;
  return {
    reward: 0,
    correct: false,
    extracted: null,
    matchedBy: null,
    reason: 'trajectory finished with an error',
  };
}

export function toScored(r: VerifyResult): Scored {
  return {
    reward: r.reward ?? (r.correct ? 1 : 0),
    correct: r.correct,
    extracted: r.extracted,
    matchedBy: r.matchedBy,
    reason: r.reason,
    ...(r.status === 'timeout' ? { timedOut: true as const } : {}),
    ...(r.penalty !== undefined ? { penalty: r.penalty } : {}),
    ...(r.status === 'error' ? { errored: true as const } : {}),
  };
}

/** The one reward: a whole trajectory (its text and how it finished) scored against a gold answer. */
export function scoreTrajectory(
  t: { text: string; finish?: string },
  gold: string,
  profile: VerifyProfile = 'strict',
): Scored {
  return erroredScore(t) ?? toScored(verify(t.text, gold, { profile }));
}
