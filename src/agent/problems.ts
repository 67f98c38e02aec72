import { type LoadOptions, loadProblems as loadData, loadProblemsSync, type Problem } from '../data/index.js';
import type { RolloutProblem } from './loop.js';

// Rollouts read problem files through src/data (JSONL or Parquet; verl, DAPO or plain rows) and carry the
// gold answer as `gold`.

export function toRolloutProblem(p: Problem): RolloutProblem {
  const r: RolloutProblem = { id: p.id, question: p.question };
  if (p.answer !== null) r.gold = p.answer;
  return r;
}

// A repeated row (the same id: src/data refuses one id on two questions) is sampled once; twice, its trajectories
// would share ids, and a resumed rollout could not tell them apart.
function once(problems: Problem[]): RolloutProblem[] {
  const seen = new Set<string>();
  return problems.filter((p) => !seen.has(p.id) && seen.add(p.id)).map(toRolloutProblem);
}

export async function loadRolloutProblems(spec: string, opts: LoadOptions = {}): Promise<RolloutProblem[]> {
  return once(await loadData(spec, opts));
}

/** The synchronous form, JSONL only: `{id?, problem|question|prompt, answer|gold?}` per line, or verl/DAPO rows. */
export function loadProblems(path: string, limit?: number): RolloutProblem[] {
  return once(loadProblemsSync(path, { limit }));
}
