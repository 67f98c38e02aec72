import {
  type ChatExample,
  dedupeQuestions,
  type FilterResult,
  integerAnswers,
  loadChatExamples,
  loadProblems,
  maxPromptTokens,
  type Problem,
} from '../data/index.js';
import type { Recipe, RlStageConfig } from './config.js';

// A recipe's data sections read through data/'s loaders, shared by the trainer and `--dry-run` so both see the
// same rows after the same filters.

type FileSection = Pick<Recipe['eval'], 'files' | 'layout' | 'map' | 'limit'>;

/** Problems from a section's files, in order, each with a gold answer, at most `limit` rows in all. */
export async function sectionProblems(d: FileSection): Promise<Problem[]> {
  const out: Problem[] = [];
  for (const f of d.files ?? []) {
    const left = d.limit === null ? undefined : d.limit - out.length;
    if (left === 0) break;
    out.push(...(await loadProblems(f, { layout: d.layout, map: d.map, requireAnswer: true, limit: left })));
  }
  return out;
}

/** Chat examples from SFT files, in order, at most `limit` in all. */
export async function sectionExamples(files: string[], limit: number | null): Promise<ChatExample[]> {
  const out: ChatExample[] = [];
  for (const f of files) {
    const left = limit === null ? undefined : limit - out.length;
    if (left === 0) break;
    out.push(...(await loadChatExamples(f, { limit: left })));
  }
  return out;
}

/** The row filters a stage asks for, in order; `report` hears each filter's result. */
export function rowFilters(
  pool: Problem[],
  d: RlStageConfig['data'],
  promptTokens: (question: string) => number,
  report: (r: FilterResult<Problem>) => void,
): Problem[] {
  const apply = (r: FilterResult<Problem>) => {
    report(r);
    return r.kept;
  };
  if (d.integerOnly) pool = apply(integerAnswers(pool));
  if (d.dedupe) pool = apply(dedupeQuestions(pool));
  if (d.maxPromptTokens !== null) pool = apply(maxPromptTokens(pool, d.maxPromptTokens, promptTokens));
  return pool;
}
