import { createHash } from 'node:crypto';
import { readRows, readRowsSync, resolveFiles, type SourceRow } from './files.js';
import { isIntegerAnswer, normaliseQuestion } from './filters.js';
import { type Layout, type Problem, problemFromRow, type RowOptions } from './problem.js';

export interface LoadOptions extends RowOptions {
  limit?: number; // read only the first `limit` rows (across files, in file order)
  /**
   * Rows whose key an earlier row had are not kept (counted in `onRepeat`): a filter that keeps the first of
   * each key, applied while reading so a dataset of 100 copies of each problem (DAPO-Math-17k) is never held.
   */
  repeatKey?: (p: Problem) => string;
  onRepeat?: () => void;
}

// Turns rows into problems, checking ids across all files: a repeated row (same id, same question) is a
// duplicate that dedupeQuestions removes; the same id on another question is an error.
class Collector {
  readonly problems: Problem[] = [];
  readonly layouts: Partial<Record<Layout, number>> = {};
  private readonly ids = new Map<string, { where: string; question: string }>();
  private readonly keys = new Set<string>();

  constructor(private readonly opts: LoadOptions) {
    const n = opts.limit;
    if (n !== undefined && !(Number.isInteger(n) && n > 0))
      throw new Error(`limit must be a positive integer, got ${n}`);
  }

  get full(): boolean {
    return this.opts.limit !== undefined && this.problems.length >= this.opts.limit;
  }

  add({ row, where, index }: SourceRow): void {
    const { problem, layout } = problemFromRow(row, where, index, this.opts);
    if (this.opts.repeatKey) {
      const k = this.opts.repeatKey(problem);
      if (this.keys.has(k)) {
        this.opts.onRepeat?.();
        return;
      }
      this.keys.add(k);
    }
    const first = this.ids.get(problem.id);
    if (first && first.question !== problem.question) {
      throw new Error(
        `${where}: duplicate id '${problem.id}' for a different question (first at ${first.where}): ` +
          `a duplicate problem id '${problem.id}' would merge two problems' rollouts and scores`,
      );
    }
    if (!first) this.ids.set(problem.id, { where, question: problem.question });
    this.layouts[layout] = (this.layouts[layout] ?? 0) + 1;
    this.problems.push(problem);
  }

  done(spec: string): Problem[] {
    if (this.problems.length === 0) throw new Error(`no problems: ${spec} has no rows`);
    return this.problems;
  }
}

async function collect(files: string[], opts: LoadOptions): Promise<Collector> {
  const c = new Collector(opts);
  for await (const r of readRows(files)) {
    c.add(r);
    if (c.full) break;
  }
  return c;
}

/**
 * Problems from JSONL or Parquet files (a path, directory or glob), each row read in the verl, DAPO or plain
 * layout (detected per row unless `layout` is given), with `map` overriding where fields are read.
 */
export async function loadProblems(spec: string, opts: LoadOptions = {}): Promise<Problem[]> {
  return (await collect(resolveFiles(spec, 'problems'), opts)).done(spec);
}

/** loadProblems for callers that cannot await: JSONL only. */
export function loadProblemsSync(spec: string, opts: LoadOptions = {}): Problem[] {
  const c = new Collector(opts);
  for (const r of readRowsSync(resolveFiles(spec, 'problems'))) {
    c.add(r);
    if (c.full) break;
  }
  return c.done(spec);
}

export interface DataReport {
  files: string[];
  layouts: Partial<Record<Layout, number>>;
  rows: number;
  withAnswer: number;
  integerAnswers: number;
  duplicateQuestions: number;
  first: Problem[];
}

// 16 bytes stand for a question: a dataset of millions of rows is counted, not held (DAPO-Math-17k repeats each
// of its 17,917 problems 100 times: 1.8M rows in a few MB of Parquet)
const digest = (s: string) => createHash('sha1').update(s).digest('base64').slice(0, 16);

/**
 * What `rstar2 data inspect` prints: layouts found, counts, and the first `show` problems as mapped. Rows are
 * counted as they are read, so a file of any row count is inspected in the memory of its largest row group.
 */
export async function inspectProblems(
  spec: string,
  opts: LoadOptions & { show?: number } = {},
): Promise<DataReport> {
  const files = resolveFiles(spec, 'problems');
  const report: DataReport = {
    files,
    layouts: {},
    rows: 0,
    withAnswer: 0,
    integerAnswers: 0,
    duplicateQuestions: 0,
    first: [],
  };
  // id -> its question's digest and the row's index: one short string per row
  const ids = new Map<string, string>();
  const questions = new Set<string>();
  const starts: { file: string; index: number }[] = [];
  for await (const { row, where, index } of readRows(files)) {
    if (!where.startsWith(starts[starts.length - 1]?.file ?? '\0'))
      starts.push({ file: where.replace(/(:\d+| row \d+)$/, ''), index });
    const { problem: p, layout } = problemFromRow(row, where, index, opts);
    const q = digest(p.question);
    const first = ids.get(p.id);
    if (first !== undefined && first.slice(0, 16) !== q) {
      const at = Number(first.slice(16));
      const f = starts.findLast((s) => s.index <= at) as { file: string; index: number };
      throw new Error(
        `${where}: duplicate id '${p.id}' for a different question (first in row ${at - f.index + 1} of ${f.file})`,
      );
    }
    if (first === undefined) ids.set(p.id, `${q}${index}`);
    report.layouts[layout] = (report.layouts[layout] ?? 0) + 1;
    report.rows++;
    if (p.answer !== null) report.withAnswer++;
    if (isIntegerAnswer(p.answer)) report.integerAnswers++;
    const k = digest(normaliseQuestion(p.question));
    if (questions.has(k)) report.duplicateQuestions++;
    else questions.add(k);
    if (report.first.length < (opts.show ?? 3)) report.first.push(p);
    if (opts.limit !== undefined && report.rows >= opts.limit) break;
  }
  if (report.rows === 0) throw new Error(`no problems: ${spec} has no rows`);
  return report;
}
