#!/usr/bin/env node
// The import rules of src/ (docs/ARCHITECTURE.md, "Floors" and "Doors"); run by `npm run check`, fails on:
// - an import that runs upward between floors. A folder may import its own floor or any floor below; every
//   `<folder>/cli.ts` is part of the command tree and sits on the top floor;
// - an import from another folder that bypasses its index.ts (util/ has no door: its modules are imported one by
//   one). cli/program.ts enters each `<folder>/cli.ts` directly, and a cli.ts's static imports may name another
//   folder's module: registering a command must not load whole folders (bench/cli-startup.ts); what an action
//   runs comes through the door, imported inside the action;
// - a cycle of runtime imports that crosses folders: a door loads its whole folder, so such a cycle would let one
//   folder's module run before another's it needs is initialised. `import type` is erased and does not count.
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

// static import/export-from (1: the clause, 2: the path), side-effect imports (3) and dynamic import('…') (4)
const IMPORT =
  /(?:^|\n)\s*(?:import|export)\s([^;'"]*?)from\s*['"]([^'"]+)['"]|(?:^|\n)\s*import\s*['"]([^'"]+)['"]|import\(\s*['"]([^'"]+)['"]\s*\)/g;
const fileFloor = (rel) => {
  const [folder, name] = rel.split('/');
  if (name === 'cli.ts') return TOP;
  const f = floorOf.get(folder);
  if (f === undefined)
    throw new Error(`src/${folder}/ has no floor: add it to FLOORS in scripts/check-imports.mjs`);
  return f;
};
/** `import type {…}`, or braces of `type …` specifiers only: erased, nothing runs. */
const typeOnly = (clause) => {
  const c = clause.trim();
  if (/^type\s/.test(c)) return true;
  const m = /^\{([^}]*)\}$/.exec(c);
  return Boolean(m) && m[1].split(',').every((s) => !s.trim() || /^type\s/.test(s.trim()));
};

const upward = [];
const bypass = [];
const edges = new Map(); // file -> files it imports at run time
for (const file of files) {
  const from = relative(root, file);
  const [a, fromName] = from.split('/');
  edges.set(from, []);
  for (const m of readFileSync(file, 'utf8').matchAll(IMPORT)) {
    const spec = m[2] ?? m[3] ?? m[4];
    if (!spec.startsWith('.')) continue;
    const to = relative(root, resolve(dirname(file), spec)).replace(/\.js$/, '.ts');
    if (m[1] === undefined || !typeOnly(m[1])) edges.get(from).push(to);
    const [b, name] = to.split('/');
    if (a === b || !name) continue;
    if (fileFloor(to) > fileFloor(from)) upward.push(`${from} -> ${to}`);
    const door =
      name === 'index.ts' ||
      b === 'util' ||
      (name === 'cli.ts' && from === 'cli/program.ts') ||
      (fromName === 'cli.ts' && m[4] === undefined);
    if (!door) bypass.push(`${from} -> ${to}`);
  }
}

// cycles through more than one folder, each reported once by its smallest member
const cycles = new Set();
const state = new Map(); // 1: on the path, 2: done
const path = [];
function visit(f) {
  state.set(f, 1);
  path.push(f);
  for (const t of edges.get(f) ?? []) {
    if (state.get(t) === 1) {
      const loop = path.slice(path.indexOf(t));
      if (new Set(loop.map((x) => x.split('/')[0])).size > 1) {
        const i = loop.indexOf([...loop].sort()[0]);
        cycles.add([...loop.slice(i), ...loop.slice(0, i), loop[i]].join(' -> '));
      }
    } else if (!state.has(t)) visit(t);
  }
  path.pop();
  state.set(f, 2);
}
for (const f of edges.keys()) if (!state.has(f)) visit(f);

for (const x of upward) console.error(`import runs upward: ${x}`);
for (const x of bypass) console.error(`import bypasses the folder's index.ts: ${x}`);
for (const x of cycles) console.error(`import cycle across folders: ${x}`);
const n = upward.length + bypass.length + cycles.size;
if (n) {
  console.error(
    `check-imports: ${upward.length} upward, ${bypass.length} bypassing index.ts, ${cycles.size} cycle(s); the rules are in docs/ARCHITECTURE.md`,
  );
  process.exit(1);
}
