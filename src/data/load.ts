import { readRows, readRowsSync, resolveFiles, type SourceRow } from './files.js';
import { dedupeQuestions, isIntegerAnswer } from './filters.js';
import { type Layout, type Problem, problemFromRow, type RowOptions } from './problem.js';

export interface LoadOptions extends RowOptions {
  limit?: number; // read only the first `limit` rows (across files, in file order)
}

// Turns rows into problems, checking ids across all files: a repeated row (same id, same question) is a
// duplicate that dedupeQuestions removes; the same id on another question is an error.
class Collector {
  readonly problems: Problem[] = [];
  readonly layouts: Partial<Record<Layout, number>> = {};
  private readonly ids = new Map<string, { where: string; question: string }>();

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

/** What `rstar2 data inspect` prints: layouts found, counts, and the first `show` problems as mapped. */
export async function inspectProblems(
  spec: string,
  opts: LoadOptions & { show?: number } = {},
): Promise<DataReport> {
  const files = resolveFiles(spec, 'problems');
  const c = await collect(files, opts);
  const ps = c.done(spec);
  return {
    files,
    layouts: c.layouts,
    rows: ps.length,
    withAnswer: ps.filter((p) => p.answer !== null).length,
    integerAnswers: ps.filter((p) => isIntegerAnswer(p.answer)).length,
    duplicateQuestions: dedupeQuestions(ps).dropped,
    first: ps.slice(0, opts.show ?? 3),
  };
}
