#!/usr/bin/env node
// Entry point. Runs the compiled dist/ (`npm run build`, done by `prepack`) when it is there and not older
// than the sources, else the TypeScript sources through tsx, so a checkout works after `npm install` alone
// and a developer editing src/ never runs stale build output. An installed package has no src/: dist/ it is.
// Staleness: dist/.build-stamp carries the time its build started; dist/ is stale if anything under src/
// (files and directories, so added and deleted files count; .md notes aside) or a tsconfig is newer.
// That is one readdir per directory and one stat per entry (~130 here): about 2 ms, against the ~0.7 s
// that tsx adds to a start.
// RSTAR2_FROM_SOURCE=1 forces the sources; RSTAR2_DEBUG=1 also maps dist/ stack traces back to src/.
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { fileURLToPath, pathToFileURL } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const arg = process.argv[2];
if (arg === '--version' || arg === '-V') {
  console.log(JSON.parse(readFileSync(`${root}package.json`, 'utf8')).version);
  process.exit(0);
}

function mtime(path) {
  try {
    return statSync(path).mtimeMs;
  } catch {
    return null;
  }
}

/** Whether anything under `dir` (.md notes aside) changed at or after `since`; a vanished entry counts. */
function changedSince(dir, since) {
  for (const name of readdirSync(dir)) {
    if (name.endsWith('.md')) continue;
    let s;
    try {
      s = statSync(`${dir}/${name}`);
    } catch {
      return true; // removed between readdir and stat: being rewritten, not settled
    }
    if (s.mtimeMs >= since || (s.isDirectory() && changedSince(`${dir}/${name}`, since))) return true;
  }
  return false;
}

/** 'dist' or 'src': which tree to run. */
function pick() {
  if (mtime(`${root}src`) === null) {
    if (mtime(`${root}dist/cli/main.js`) === null)
      throw new Error(`rstar2: neither ${root}dist nor ${root}src exists (a broken install)`);
    return 'dist';
  }
  const built = mtime(`${root}dist/.build-stamp`);
  if (built === null || process.env.RSTAR2_FROM_SOURCE === '1') return 'src';
  const newest = Math.max(
    mtime(`${root}src`),
    mtime(`${root}tsconfig.json`) ?? 0,
    mtime(`${root}tsconfig.build.json`) ?? 0,
  );
  return newest >= built || changedSince(`${root}src`, built) ? 'src' : 'dist';
}

if (pick() === 'dist') {
  if (process.env.RSTAR2_DEBUG) process.setSourceMapsEnabled(true);
  await import(pathToFileURL(`${root}dist/cli/main.js`).href);
} else {
  const { register } = await import('tsx/esm/api');
  register();
  await import(pathToFileURL(`${root}src/cli/main.ts`).href);
}
