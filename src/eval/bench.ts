import { existsSync, readdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { readJsonl } from '../util/jsonl.js';
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

export function resolveBench(name: string): string {
  const file = `${ALIASES[name] ?? name}.jsonl`;
  for (const d of benchDirs()) if (existsSync(join(d, file))) return join(d, file);
  const known = listBenchmarks();
  throw new Error(
    `unknown benchmark '${name}'; available: ${known.join(', ') || '(none found)'} ` +
      `(searched ${benchDirs().join(', ')}); or pass --data FILE`,
  );
}

/** Reads and validates a benchmark JSONL; numeric answers become strings. */
export function loadProblems(path: string): BenchProblem[] {
  if (!existsSync(path)) throw new Error(`benchmark file not found: ${path}`);
  const rows = readJsonl<Record<string, unknown>>(path);
  const seen = new Set<string>();
  const out = rows.map((r, i) => {
    const where = `${path}:${i + 1}`;
    if (r === null || typeof r !== 'object') throw new Error(`${where}: expected an object`);
    const id = typeof r.id === 'number' ? String(r.id) : r.id;
    const answer = typeof r.answer === 'number' ? String(r.answer) : r.answer;
    if (typeof id !== 'string' || id === '') throw new Error(`${where}: missing string field 'id'`);
    if (typeof r.problem !== 'string' || r.problem === '')
      throw new Error(`${where}: missing string field 'problem'`);
    if (typeof answer !== 'string') throw new Error(`${where}: missing string field 'answer'`);
    if (seen.has(id)) throw new Error(`${where}: duplicate id '${id}'`);
    seen.add(id);
    return { id, problem: r.problem, answer };
  });
  if (out.length === 0) throw new Error(`benchmark file is empty: ${path}`);
  return out;
}
