// Cold start of the CLI: `rstar2 --help` from the compiled dist/ vs through tsx (the fallback a checkout
// runs while dist/ is missing or stale), next to bare node, `--version` (answered before any import) and
// the staleness check alone. Builds dist/ in a throw-away copy of the checkout (the working tree's dist/
// is left alone), then runs each variant N times round-robin and prints the median.
// Run: flock /tmp/bench.lock node --import tsx bench/cli-startup.ts [--runs 15]
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { cleanEnv, sh, stageCheckout } from '../test/package/stage.js';
import { benchArgs, median } from './args.js';

const { values } = benchArgs(import.meta.url, { options: { runs: { type: 'string', default: '15' } } });
const runs = Number(values.runs);
const stage = stageCheckout('rstar2-startup-');
try {
  const build = sh(process.execPath, ['scripts/build.mjs'], { cwd: stage.dir });
  const bin = join(stage.dir, 'bin/rstar2.js');
  // the walk bin/rstar2.js does before choosing dist/ (same code), timed inside a fresh process
  const check = `const { readdirSync, statSync } = require('node:fs'); const t = performance.now();
const changedSince = (dir, since) => readdirSync(dir).some((n) => {
  if (n.endsWith('.md')) return false;
  const s = statSync(dir + '/' + n);
  return s.mtimeMs >= since || (s.isDirectory() && changedSince(dir + '/' + n, since));
});
if (changedSince(${JSON.stringify(join(stage.dir, 'src'))}, statSync(${JSON.stringify(join(stage.dir, 'dist/.build-stamp'))}).mtimeMs)) process.exit(1);
console.log((performance.now() - t).toFixed(3));`;
  const variants: { name: string; args: string[]; env?: Record<string, string>; inner?: boolean }[] = [
    { name: 'node -e 0 (bare node)', args: ['-e', '0'] },
    { name: 'rstar2 --version', args: [bin, '--version'] },
    { name: 'rstar2 --help, compiled dist/', args: [bin, '--help'] },
    { name: 'rstar2 --help, tsx (sources)', args: [bin, '--help'], env: { RSTAR2_FROM_SOURCE: '1' } },
    { name: 'staleness check alone (in-process)', args: ['-e', check], inner: true },
  ];
  const times = variants.map(() => [] as number[]);
  for (let r = -1; r < runs; r++) {
    variants.forEach((v, i) => {
      const t0 = performance.now();
      const p = spawnSync(process.execPath, v.args, {
        cwd: stage.dir,
        env: cleanEnv(v.env),
        encoding: 'utf8',
      });
      const ms = performance.now() - t0;
      if (p.status !== 0) throw new Error(`${v.name}: exit ${p.status}\n${p.stderr}`);
      if (r >= 0) times[i].push(v.inner ? Number(p.stdout) : ms); // run -1 warms caches (fs, tsx)
    });
  }
  const cpu = /model name\s*:\s*(.*)/.exec(readFileSync('/proc/cpuinfo', 'utf8'))?.[1] ?? 'unknown CPU';
  console.log(
    `${cpu}, Node ${process.version}, median of ${runs} runs (min-max); build ${build.ms.toFixed(0)} ms`,
  );
  console.log(`| ${'variant'.padEnd(36)} | ${'median ms'.padStart(9)} | ${'min-max ms'.padStart(13)} |`);
  console.log(`|${'-'.repeat(38)}|${'-'.repeat(10)}:|${'-'.repeat(14)}:|`);
  variants.forEach((v, i) => {
    const d = v.inner ? 2 : 0;
    const span = `${Math.min(...times[i]).toFixed(d)}-${Math.max(...times[i]).toFixed(d)}`;
    console.log(
      `| ${v.name.padEnd(36)} | ${median(times[i]).toFixed(d).padStart(9)} | ${span.padStart(13)} |`,
    );
  });
} finally {
  stage.remove();
}
