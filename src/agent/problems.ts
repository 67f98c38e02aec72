import { readJsonl } from '../util/jsonl.js';
import type { RolloutProblem } from './loop.js';

/** Problems from JSONL: `{id?, problem|question|prompt, answer|gold?}` per line (the data/ format). */
export function loadProblems(path: string, limit?: number): RolloutProblem[] {
  const rows = readJsonl<Record<string, unknown>>(path);
  if (rows.length === 0) throw new Error(`${path}: no problems (file missing or empty)`);
  const out = rows.map((r, i) => {
    const q = r.problem ?? r.question ?? r.prompt;
    if (typeof q !== 'string' || q.length === 0) {
      throw new Error(
        `${path}:${i + 1}: needs a non-empty string field 'problem' (or 'question' / 'prompt')`,
      );
    }
    const gold = r.answer ?? r.gold;
    const p: RolloutProblem = { id: r.id === undefined ? `p${i}` : String(r.id), question: q };
    if (gold !== undefined && gold !== null) p.gold = String(gold);
    return p;
  });
  const ids = new Set<string>();
  for (const p of out) {
    if (ids.has(p.id)) throw new Error(`${path}: duplicate problem id '${p.id}'`);
    ids.add(p.id);
  }
  return limit === undefined ? out : out.slice(0, limit);
}
