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
import { Rng, seedFor } from '../util/rng.js';
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

/**
 * A stage's prompts as verl's shuffled dataloader gives them (RandomSampler, drop_last): each source (one without
 * `weights`) is walked in a seeded shuffle without replacement, reshuffled for every epoch; a step takes the next
 * items, and when fewer are left in the epoch than it needs they are dropped and the next epoch starts, so a
 * step's prompts are distinct. With weights, a draw first splits its k prompts among the sources by weight (as
 * weightedSample does), then takes each source's share from that source's walk. Draw d (0-based over the stage,
 * redraws counted) depends only on d, so a resumed stage that knows how many draws it made goes on exactly.
 */
export class EpochSampler<T extends object> {
  private readonly sources: T[][];
  private walks: { epoch: number; pos: number; order: T[] }[] = [];
  private made = 0;

  constructor(
    items: T[],
    private readonly weights: number[] | null,
    private readonly k: number,
    private readonly seed: number,
  ) {
    this.sources = weights ? weights.map((_, j) => items.filter((it) => entryOf(it) === j)) : [items];
    if (drawable(items, weights) < k)
      throw new Error(
        `EpochSampler: ${k} prompts a draw, but the sources with a weight hold ${drawable(items, weights)}`,
      );
    this.restart();
  }

  /** The prompts of draw `d`: the draws before it are replayed when d is not the next one (counts only, cheap). */
  draw(d: number): T[] {
    if (!Number.isInteger(d) || d < 0)
      throw new Error(`EpochSampler: draw must be an integer >= 0, got ${d}`);
    if (d < this.made) this.restart();
    while (this.made < d) this.take(this.made);
    return this.take(d);
  }

  /** The epoch each source's walk is in (after the draws made so far). */
  epochs(): number[] {
    return this.walks.map((w) => w.epoch);
  }

  private restart(): void {
    this.walks = this.sources.map((_, i) => ({ epoch: 0, pos: 0, order: this.shuffled(i, 0) }));
    this.made = 0;
  }

  private shuffled(source: number, epoch: number): T[] {
    return new Rng(seedFor(this.seed, 'epoch', source, epoch)).shuffle(this.sources[source]);
  }

  /** How many of draw d's prompts each source gives. */
  private counts(d: number): number[] {
    if (!this.weights) return [this.k];
    const rng = new Rng(seedFor(this.seed, 'mix', d));
    const n = this.sources.map(() => 0);
    for (let j = 0; j < this.k; j++)
      n[
        pickSource(
          this.weights.map((w, i) => (n[i] < this.sources[i].length ? w : 0)),
          rng,
        )
      ]++;
    return n;
  }

  private take(d: number): T[] {
    const out: T[] = [];
    for (const [i, c] of this.counts(d).entries()) {
      if (c === 0) continue;
      const w = this.walks[i];
      if (w.order.length - w.pos < c) {
        w.epoch++;
        w.pos = 0;
        w.order = this.shuffled(i, w.epoch);
      }
      out.push(...w.order.slice(w.pos, w.pos + c));
      w.pos += c;
    }
    this.made = d + 1;
    return out;
  }
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
