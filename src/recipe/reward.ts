import type { Trajectory } from '../agent/trajectory.js';
import { extractAnswer } from '../reward/extract.js';

// Outcome reward for the quickstart's integer answers: 1 when the last boxed answer (Math-Verify priority
// order) equals the gold integer, else 0. Recipes with non-integer answers plug in reward/'s verifier.

export type RewardFn = (
  t: Trajectory,
  gold: string,
) => { reward: number; correct: boolean; extracted: string | null };

function asInteger(s: string): string | null {
  const t = s.replace(/[\s,$]/g, '').replace(/^\\text\{(.*)\}$/, '$1');
  return /^[-+]?\d+$/.test(t) ? BigInt(t).toString() : null;
}

export const integerReward: RewardFn = (t, gold) => {
  const ex = t.finish === 'error' ? null : extractAnswer(t.text);
  // Only a boxed answer counts: the fallbacks (last number, ...) would credit a copied tool stdout that the
  // model never turned into an answer.
  const got = ex && ex.source === 'boxed' ? asInteger(ex.answer) : null;
  const correct = got !== null && got === asInteger(gold);
  return { reward: correct ? 1 : 0, correct, extracted: ex?.answer ?? null };
};
