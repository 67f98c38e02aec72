import { checkProfile, VerifierPool, type VerifyProfile } from '../reward/index.js';
import type { Trajectory } from '../rl/index.js';
import { normaliseAnswer } from './score.js';

/** Scores a trajectory's text (and finish: an errored rollout scores 0) against the gold answer. */
export type VerifyFn = (
  t: { text: string; finish?: string },
  gold: string,
  row?: unknown,
) => Promise<{
  correct: boolean;
  extracted: string | null;
  matchedBy: string | null;
  reason?: string;
  reward?: number;
}>;

/** Last \boxed{...} in the text, braces balanced. */
export function lastBoxed(text: string): string | null {
  const at = text.lastIndexOf('\\boxed{');
  if (at < 0) return null;
  let depth = 0;
  for (let i = at + '\\boxed'.length; i < text.length; i++) {
    if (text[i] === '{') depth++;
    else if (text[i] === '}' && --depth === 0) return text.slice(at + '\\boxed{'.length, i);
  }
  return null;
}

// A dependency-free stand-in (tests, dry runs): exact match of the normalised last \\boxed{}.
export const fallbackVerify: VerifyFn = async ({ text }, gold) => {
  const extracted = lastBoxed(text);
  if (extracted === null) return { correct: false, extracted: null, matchedBy: null, reason: 'no \\boxed{}' };
  const ok = normaliseAnswer(extracted) === normaliseAnswer(gold);
  return { correct: ok, extracted, matchedBy: ok ? 'normalised-string' : null };
};

export interface Verifier {
  verify: VerifyFn;
  close(): Promise<void>;
}

/** What an eval records as its verifyProfile when a reward module scores it (`--reward-module`). */
export const MODULE_PROFILE = 'module:';

/**
 * reward/'s one scoring function on its worker-thread pool (each check time-limited, never lost): a profile,
 * or `module:/abs/path.mjs`, a reward module's function (reward/custom.ts).
 */
export function openVerifier(profile: VerifyProfile | string = 'strict'): Verifier {
  if (profile.startsWith(MODULE_PROFILE)) {
    const pool = new VerifierPool({ defaults: { module: profile.slice(MODULE_PROFILE.length) } });
    return { verify: (t, gold, row) => pool.score(t, gold, undefined, row), close: () => pool.close() };
  }
  const p = checkProfile(profile);
  const pool = new VerifierPool({ defaults: { profile: p } });
  return { verify: (t, gold) => pool.score(t, gold, p), close: () => pool.close() };
}

/** Fills gold/reward/correct/verify on a trajectory that the rollout left unscored. */
export async function withScore(
  t: Trajectory,
  gold: string,
  verify: VerifyFn,
  row?: unknown,
): Promise<Trajectory> {
  if (typeof t.correct === 'boolean' && t.verify && t.gold === gold) return t;
  const v = await verify(t, gold, row);
  return {
    ...t,
    gold,
    correct: v.correct,
    reward: v.reward ?? (v.correct ? 1 : 0),
    verify: { extracted: v.extracted, matchedBy: v.matchedBy, reason: v.reason },
  };
}
