import { existsSync, readdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { loadProblemsSync } from '../data/index.js';
import type { BenchProblem } from './score.js';

// Benchmarks are JSONL files of {id, problem, answer}. Named ones are looked up in RSTAR2_BENCH_DIR first,
// then the project's data folder (relative to the working directory, then to the checkout).
const ALIASES: Record<string, string> = { hmmt25: 'hmmt_feb25', 'hmmt-feb25': 'hmmt_feb25' };

export function benchDirs(): string[] {
  const dirs = [resolve('data/benchmarks'), new URL('../../data/benchmarks/', import.meta.url).pathname];
  if (process.env.RSTAR2_BENCH_DIR) dirs.unshift(process.env.RSTAR2_BENCH_DIR);
  return [...new Set(dirs.map((d) => resolve(d)))];
}

export function listBenchmarks(): string[] {
  const names = new Set<string>();
  for (const d of benchDirs()) {
    if (!existsSync(d)) continue;
    for (const f of readdirSync(d)) if (f.endsWith('.jsonl')) names.add(f.slice(0, -'.jsonl'.length));
  }
  return [...names].sort();
}

/** The other names a benchmark answers to (`hmmt25` for hmmt_feb25). */
export function benchAliases(name: string): string[] {
  return Object.keys(ALIASES).filter((a) => ALIASES[a] === name);
}

export function resolveBench(name: string): string {
  const file = `${ALIASES[name] ?? name}.jsonl`;
  for (const d of benchDirs()) if (existsSync(join(d, file))) return join(d, file);
  const known = listBenchmarks();
  throw new Error(
    `unknown benchmark '${name}'; available: ${known.join(', ') || '(none found)'} ` +
      `(searched ${benchDirs().join(', ')}); or pass --data FILE`,
  );
}

/**
 * A benchmark's problems through src/data (any layout it reads; every row needs a gold answer). Synchronous, so
 * JSONL only; src/data's async loadProblems also reads Parquet.
 */
export function loadProblems(path: string): BenchProblem[] {
  return loadProblemsSync(path, { requireAnswer: true }).map((p) => ({
    id: p.id,
    problem: p.question,
    answer: p.answer as string,
  }));
}
