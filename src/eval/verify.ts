import type { Trajectory } from '../agent/trajectory.js';
import { normaliseAnswer } from './score.js';

export type VerifyFn = (
  pred: string,
  gold: string,
) => Promise<{ correct: boolean; extracted: string | null; matchedBy: string | null; reason?: string }>;

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

// Used only when the reward subsystem's verifier is not importable: exact match after normalisation.
export const fallbackVerify: VerifyFn = async (pred, gold) => {
  const extracted = lastBoxed(pred);
  if (extracted === null) return { correct: false, extracted: null, matchedBy: null, reason: 'no \\boxed{}' };
  const ok = normaliseAnswer(extracted) === normaliseAnswer(gold);
  return { correct: ok, extracted, matchedBy: ok ? 'normalised-string' : null };
};

/** The reward subsystem's `verify` when it exists; the fallback (with a warning) otherwise. */
export async function loadVerifier(warn: (m: string) => void = console.error): Promise<VerifyFn> {
  try {
    const spec = '../reward/index.js';
    const mod = (await import(spec)) as { verify?: (p: string, g: string, ...rest: unknown[]) => unknown };
    if (typeof mod.verify === 'function') {
      const v = mod.verify;
      return async (pred, gold) => {
        const r = (await v(pred, gold)) as {
          correct: boolean;
          extracted: string | null;
          matchedBy: string | null;
          reason?: string;
        };
        return { correct: r.correct, extracted: r.extracted, matchedBy: r.matchedBy, reason: r.reason };
      };
    }
  } catch {
    // reward/ not built yet
  }
  warn('eval: reward verifier unavailable; scoring by normalised exact match of the last \\boxed{}');
  return fallbackVerify;
}

/** Fills gold/reward/correct/verify on a trajectory that the rollout left unscored. */
export async function scoreTrajectory(t: Trajectory, gold: string, verify: VerifyFn): Promise<Trajectory> {
  if (typeof t.correct === 'boolean' && t.verify && t.gold === gold) return t;
  const v = await verify(t.text, gold);
  return {
    ...t,
    gold,
    correct: v.correct,
    reward: v.correct ? 1 : 0,
    verify: { extracted: v.extracted, matchedBy: v.matchedBy, reason: v.reason },
  };
}
