import type { Problem } from './problem.js';

// Data filters as pure functions: rows in, kept rows out, with how many were dropped and why, so a recipe can
// log each step. The policy-dependent ones (too easy / too hard for the model) live with the trainer.

export interface FilterResult<T> {
  kept: T[];
  dropped: number;
  reason: string;
}

function keep<T>(rows: T[], pred: (row: T) => boolean, reason: string): FilterResult<T> {
  const kept = rows.filter(pred);
  return { kept, dropped: rows.length - kept.length, reason };
}

/** A plain decimal integer, as the reward checks integer answers: '42', '-7', '+3'; not '4.0', '1,000', '2^10'. */
export function isIntegerAnswer(answer: string | null): boolean {
  return answer !== null && /^[+-]?\d+$/.test(answer.trim());
}

export function integerAnswers<T extends Pick<Problem, 'answer'>>(rows: T[]): FilterResult<T> {
  return keep(rows, (r) => isIntegerAnswer(r.answer), 'answer is not an integer');
}

/** The text two questions are compared by: Unicode-normalised, case-folded, whitespace collapsed. */
export function normaliseQuestion(q: string): string {
  return q.normalize('NFKC').toLowerCase().replace(/\s+/g, ' ').trim();
}

/** Keeps the first of each group of questions that are equal after normaliseQuestion. */
export function dedupeQuestions<T extends Pick<Problem, 'question'>>(rows: T[]): FilterResult<T> {
  const seen = new Set<string>();
  return keep(
    rows,
    (r) => {
      const k = normaliseQuestion(r.question);
      if (seen.has(k)) return false;
      seen.add(k);
      return true;
    },
    'duplicate question',
  );
}

/** Drops problems whose prompt is longer than `max` tokens; `countTokens` renders and counts (the caller's template). */
export function maxPromptTokens<T extends Pick<Problem, 'question'>>(
  rows: T[],
  max: number,
  countTokens: (question: string) => number,
): FilterResult<T> {
  return keep(rows, (r) => countTokens(r.question) <= max, `prompt longer than ${max} tokens`);
}
