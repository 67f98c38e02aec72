#!/usr/bin/env node
// Compiles src/ to dist/ with tsc (JavaScript, .d.ts types, source maps with their sources inlined) and
// copies the non-TypeScript files the code reads next to itself (src/dashboard/static). Runs in `prepack`,
// so `npm pack`, `npm publish` and git installs build; a checkout does not need it (bin/rstar2.js falls back
// to tsx while dist/ is missing or older than src/).
// The build goes to a scratch directory (.cache/build-PID) that replaces dist/ only once it is complete, so
// a process starting meanwhile sees the old dist/, none (and runs the sources) or the new one, never half of
// one. The stamp dist/.build-stamp gets the time the build *started*: a source edited meanwhile is newer.
// Usage: node scripts/build.mjs   (npm run build)
import { spawnSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, renameSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

process.chdir(fileURLToPath(new URL('..', import.meta.url)));
const started = new Date();
// scratch space under .cache/ (git-ignored, same file system as dist/, so the swap is two renames)
const tmp = `.cache/build-${process.pid}`;
const old = `.cache/dist-old-${process.pid}`;
rmSync(tmp, { recursive: true, force: true });
mkdirSync('.cache', { recursive: true });

const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');
const r = spawnSync(process.execPath, [tsc, '-p', 'tsconfig.build.json', '--outDir', tmp], {
  stdio: 'inherit',
});
if (r.status !== 0) {
  rmSync(tmp, { recursive: true, force: true });
  console.error('build: tsc failed; dist/ left as it was');
  process.exit(r.status ?? 1);
}
cpSync('src', tmp, {
  recursive: true,
  filter: (p) => !p.endsWith('.ts') && !p.endsWith('.md'),
});
const stamp = `${tmp}/.build-stamp`;
writeFileSync(stamp, `${started.toISOString()}\n`);
utimesSync(stamp, started, started);

if (existsSync('dist')) renameSync('dist', old);
renameSync(tmp, 'dist');
rmSync(old, { recursive: true, force: true });
console.error(`build: dist/ in ${((Date.now() - started.getTime()) / 1000).toFixed(1)} s`);
