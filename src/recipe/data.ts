import {
  type ChatExample,
  dedupeQuestions,
  type FilterResult,
  integerAnswers,
  isIntegerAnswer,
  loadChatExamples,
  loadProblems,
  maxPromptTokens,
  normaliseQuestion,
  type Problem,
} from '../data/index.js';
import type { Rng } from '../util/rng.js';
import type { Recipe, RlStageConfig } from './config.js';

// A recipe's data sections read through data/'s loaders, shared by the trainer and `--dry-run` so both see the
// same rows after the same filters.

type FileSection = Pick<Recipe['eval'], 'files' | 'layout' | 'map' | 'limit'> & { weights?: number[] | null };

/** A row with the index of the `files` entry it came from, where the section mixes its sources by `weights`. */
export type FromEntry = { entry?: number };
const entryOf = (it: object) => (it as FromEntry).entry ?? 0;

/**
 * Problems from a section's files, in order, each with a gold answer, at most `limit` rows in all. With `repeats`,
 * a stage's `dedupe` is applied while reading, so repeated rows are never held: the first of each question is kept
 * (among integer answers alone with integerOnly, so the filters that follow keep what they kept before), and each
 * one dropped is counted in `repeats.dropped`.
 */
export async function sectionProblems(
  d: FileSection & { dedupe?: boolean; integerOnly?: boolean },
  repeats?: { dropped: number },
): Promise<(Problem & FromEntry)[]> {
  const out: (Problem & FromEntry)[] = [];
  const early = repeats && d.dedupe;
  const repeatKey = (p: Problem) =>
    `${d.integerOnly ? (isIntegerAnswer(p.answer) ? 'i' : 'o') : ''}${normaliseQuestion(p.question)}`;
  for (const [i, f] of (d.files ?? []).entries()) {
    const left = d.limit === null ? undefined : d.limit - out.length;
    if (left === 0) break;
    const ps = await loadProblems(f, {
      layout: d.layout,
      map: d.map,
      requireAnswer: true,
      limit: left,
      ...(early ? { repeatKey, onRepeat: () => repeats.dropped++ } : {}),
    });
    out.push(...(d.weights ? ps.map((p) => ({ ...p, entry: i })) : ps));
  }
  return out;
}

/** Chat examples from SFT files, in order, at most `limit` in all; with `weights`, each tagged with its entry. */
export async function sectionExamples(
  files: string[],
  limit: number | null,
  weights?: number[] | null,
): Promise<(ChatExample & FromEntry)[]> {
  const out: (ChatExample & FromEntry)[] = [];
  for (const [i, f] of files.entries()) {
    const left = limit === null ? undefined : limit - out.length;
    if (left === 0) break;
    const exs = await loadChatExamples(f, { limit: left });
    out.push(...(weights ? exs.map((x) => ({ ...x, entry: i })) : exs));
  }
  return out;
}

/** A source index drawn by weight among those `weights` leaves open (> 0); -1 when none is. */
function pickSource(weights: number[], rng: Rng): number {
  const total = weights.reduce((a, w) => a + w, 0);
  if (total <= 0) return -1;
  let r = rng.next() * total;
  let last = -1;
  for (const [i, w] of weights.entries()) {
    if (w <= 0) continue;
    last = i;
    if (r < w) return i;
    r -= w;
  }
  return last; // rounding at the top end
}

/**
 * k distinct items mixed by source (`data.weights`): each pick chooses a source by its weight among the sources
 * with items left, then one of its items uniformly. Without weights, a plain uniform sample.
 */
export function weightedSample<T extends object>(
  items: T[],
  weights: number[] | null,
  k: number,
  rng: Rng,
): T[] {
  if (!weights) return rng.sample(items, Math.min(k, items.length));
  const left = weights.map(() => [] as T[]);
  for (const it of items) left[entryOf(it)].push(it);
  const out: T[] = [];
  while (out.length < k) {
    const i = pickSource(
      weights.map((w, j) => (left[j].length > 0 ? w : 0)),
      rng,
    );
    if (i < 0) break;
    out.push(...left[i].splice(rng.int(0, left[i].length - 1), 1));
  }
  return out;
}

/** Draws one item with replacement, its source chosen by weight (SFT batches); uniform without weights. */
export function weightedPicker<T extends object>(items: T[], weights: number[] | null): (rng: Rng) => T {
  if (!weights) return (rng) => items[rng.int(0, items.length - 1)];
  const bySource = weights.map((_, j) => items.filter((it) => entryOf(it) === j));
  const open = weights.map((w, j) => (bySource[j].length > 0 ? w : 0));
  return (rng) => {
    const i = pickSource(open, rng);
    return bySource[i][rng.int(0, bySource[i].length - 1)];
  };
}

/** How many items the sources with a weight above 0 hold: what a step can draw. */
export function drawable(items: object[], weights: number[] | null): number {
  return weights ? items.filter((it) => (weights[entryOf(it)] ?? 0) > 0).length : items.length;
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
