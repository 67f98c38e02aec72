#!/usr/bin/env node
// Fails when an import in src/ runs upward between floors (docs/ARCHITECTURE.md, "Floors"). A folder may import
// its own floor or any floor below; every `<folder>/cli.ts` is part of the command tree and sits on the top floor.
// `--doors` also lists imports from another folder that bypass its index.ts (util/ has no door); not yet enforced.
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';

const FLOORS = [
  ['util'],
  ['tokenizer', 'reward', 'rl'],
  ['data', 'sandbox', 'worker'],
  ['engines'],
  ['agent'],
  ['eval'],
  ['recipe', 'dashboard', 'chat'],
  ['cli', 'api'],
];
const TOP = FLOORS.length - 1;
const floorOf = new Map(FLOORS.flatMap((names, i) => names.map((n) => [n, i])));

const root = resolve(process.argv.find((a) => a.startsWith('--root='))?.slice(7) ?? 'src');
const files = [];
(function walk(d) {
  for (const n of readdirSync(d)) {
    const p = join(d, n);
    if (statSync(p).isDirectory()) walk(p);
    else if (n.endsWith('.ts')) files.push(p);
  }
})(root);

// static import/export-from, side-effect imports and dynamic import('…') of a relative path
const IMPORT =
  /(?:^|\n)\s*(?:import|export)\s[^;'"]*?from\s*['"]([^'"]+)['"]|import\(\s*['"]([^'"]+)['"]\s*\)|(?:^|\n)\s*import\s*['"]([^'"]+)['"]/g;
const fileFloor = (rel) => {
  const [folder, name] = rel.split('/');
  if (name === 'cli.ts') return TOP;
  const f = floorOf.get(folder);
  if (f === undefined)
    throw new Error(`src/${folder}/ has no floor: add it to FLOORS in scripts/check-imports.mjs`);
  return f;
};

const upward = [];
const bypass = [];
for (const file of files) {
  const from = relative(root, file);
  for (const m of readFileSync(file, 'utf8').matchAll(IMPORT)) {
    const spec = m[1] ?? m[2] ?? m[3];
    if (!spec.startsWith('.')) continue;
    const to = relative(root, resolve(dirname(file), spec)).replace(/\.js$/, '.ts');
    const [a] = from.split('/');
    const [b, name] = to.split('/');
    if (a === b || !name) continue;
    if (fileFloor(to) > fileFloor(from)) upward.push(`${from} -> ${to}`);
    const door = name === 'index.ts' || (name === 'cli.ts' && from === 'cli/program.ts');
    if (!door && b !== 'util') bypass.push(`${from} -> ${to}`);
  }
}
if (process.argv.includes('--doors')) {
  for (const x of bypass) console.log(`bypasses index.ts: ${x}`);
  console.log(`${bypass.length} imports bypass a folder's index.ts`);
}
if (upward.length) {
  for (const x of upward) console.error(`import runs upward: ${x}`);
  console.error(`check-imports: ${upward.length} upward import(s); floors are in docs/ARCHITECTURE.md`);
  process.exit(1);
}
