/**
 * integer: the quickstart's reward (a boxed integer, nothing else); strict: the default reward; lenient:
 * strict plus PRIME's leniencies; reference: what rStar2's reward accepts (PRIME or Math-Verify).
 */
export type VerifyProfile = 'integer' | 'strict' | 'lenient' | 'reference';

export interface VerifyResult {
  correct: boolean;
  extracted: string | null; // answer text found in the prediction
  normalised: string | null;
  matchedBy: string | null; // which comparison path decided equality (e.g. 'integer', 'symbolic')
  reason: string; // short human explanation, also for 'not equal' and failures
  // Added by the reward subsystem (optional, additive):
  /** equal | not-equal | unknown (scored as wrong) | no-answer | timeout | error */
  status?: 'equal' | 'not-equal' | 'unknown' | 'no-answer' | 'timeout' | 'error';
  /** where the answer came from: boxed, answer-tag, final-answer-is, answer-colon, math-env, last-number, whole */
  source?: string | null;
  goldNormalised?: string | null;
  /** A reward module's reward (the profiles give correct ? 1 : 0) and extra RoC penalty. */
  reward?: number;
  penalty?: number;
}

export interface VerifyOptions {
  /** strict (default reward), lenient (adds PRIME's leniencies: ×100 percent, π≈3.14, 1e-4 tolerance), integer, reference. */
  profile?: VerifyProfile;
  /** Decimals both sides are rounded to when either is a decimal (Math-Verify's `float_rounding`); default 6. */
  floatRounding?: number;
  /**
   * reference profile only: what Math-Verify may extract from either side, math environments (`latex`) and
   * plain numbers or arithmetic (`expr`). Default both, as the reference reward reads a response.
   */
  targets?: ('latex' | 'expr')[];
  /** false: `pred` is already the answer (no extraction from a response). Default true. */
  extract?: boolean;
  /** Time limit per check in ms (default 1000). In-thread checks stop cooperatively; the pool kills. */
  timeoutMs?: number;
  /** Longer predictions keep only their last this-many characters (default 200,000), noted in the reason. */
  maxInputChars?: number;
  /** An extracted answer longer than this is rejected (default 1,000, as the PRIME grader). */
  maxAnswerChars?: number;
  /**
   * PRIME's leniencies, each on in `lenient` and `reference` (the reference reward has them) and off in
   * `strict`: `percentTimes100` (pred = gold·100 or gold/100), `nearMissIntegers` (the 1e-4 relative
   * tolerance between two integers too: 100000 ≈ 100001), `piAs314` (π also as 3.14).
   */
  leniencies?: Partial<Record<'percentTimes100' | 'nearMissIntegers' | 'piAs314', boolean>>;
  /** Seed for random-point evaluation (default 1234). */
  seed?: number;
  /** An ES module whose default export scores instead of the profile (reward/custom.ts); absolute path. */
  module?: string;
}
