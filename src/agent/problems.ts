import { type LoadOptions, loadProblems as loadData, loadProblemsSync, type Problem } from '../data/index.js';
import type { RolloutProblem } from './loop.js';

// Rollouts read problem files through src/data (JSONL or Parquet; verl, DAPO or plain rows) and carry the
// gold answer as `gold`.

export function toRolloutProblem(p: Problem): RolloutProblem {
  const r: RolloutProblem = { id: p.id, question: p.question };
  if (p.answer !== null) r.gold = p.answer;
  return r;
}

export async function loadRolloutProblems(spec: string, opts: LoadOptions = {}): Promise<RolloutProblem[]> {
  return (await loadData(spec, opts)).map(toRolloutProblem);
}

/** The synchronous form, JSONL only: `{id?, problem|question|prompt, answer|gold?}` per line, or verl/DAPO rows. */
export function loadProblems(path: string, limit?: number): RolloutProblem[] {
  return loadProblemsSync(path, { limit }).map(toRolloutProblem);
}
