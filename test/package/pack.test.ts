import assert from 'node:assert/strict';
import { mkdirSync, readFileSync, utimesSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { REPO, sh, stageCheckout } from './stage.js';

// The package as a user gets it: `npm pack` (its prepack builds dist/) in a copy of the checkout, the
// tarball installed into an empty project from the local npm cache, then the CLI and the library entry
// points used from there. About 40-60 s on 2 busy cores, most of it tsc (~25 s) and npm install.

const VERSION = JSON.parse(readFileSync(join(REPO, 'package.json'), 'utf8')).version as string;
const npm = 'npm';
const quiet = ['--no-audit', '--no-fund', '--loglevel=error'];

describe('npm package', { timeout: 300_000 }, () => {
  let stage: { dir: string; remove: () => void };
  let app: string;
  let files: string[];

  before(() => {
    stage = stageCheckout('rstar2-pack-');
    const out = join(stage.dir, '..', 'out');
    mkdirSync(out);
    const packed = sh(npm, ['pack', '--json', '--pack-destination', out, ...quiet], { cwd: stage.dir });
    // npm pack --json prints the prepack's output first; the JSON report is the last thing on stdout
    const report = JSON.parse(packed.stdout.slice(packed.stdout.lastIndexOf('\n[') + 1)) as {
      filename: string;
      files: { path: string }[];
    }[];
    files = report[0].files.map((f) => f.path);
    app = join(stage.dir, '..', 'app');
    mkdirSync(app);
    writeFileSync(join(app, 'package.json'), '{ "name": "app", "private": true, "type": "module" }\n');
    sh(npm, ['install', '--prefer-offline', ...quiet, join(out, report[0].filename)], { cwd: app });
  });
  after(() => stage?.remove());

  test('the tarball holds the build, the Python side and the data the code reads, and no tests or benches', () => {
    for (const f of [
      'bin/rstar2.js',
      'dist/cli/main.js',
      'dist/cli/main.js.map',
      'dist/api/reward.js',
      'dist/api/reward.d.ts',
      'dist/api/rl.d.ts',
      'dist/api/sandbox.d.ts',
      'dist/reward/verify-thread.js',
      'dist/dashboard/static/app.js',
      'dist/dashboard/static/style.css',
      'python/sandbox/broker.py',
      'python/rstar2_worker/__main__.py',
      'data/recipes/quickstart.yaml',
      'data/benchmarks/aime24.jsonl',
      'data/samples/dapo-arith.jsonl',
      'package.json',
      'README.md',
    ])
      assert.ok(files.includes(f), `${f} missing from the tarball`);
    const unwanted = files.filter((f) =>
      /^(src|test|bench|scripts|docs|python\/bench|python\/tests)\/|\.pyc$|__pycache__|\.build-stamp|quickstart-results|^tsconfig/.test(
        f,
      ),
    );
    assert.deepEqual(unwanted, []);
  });

  test('rstar2 --help, --version and train --print-config run from the installed package', () => {
    const help = sh('npx', ['--no-install', 'rstar2', '--help'], { cwd: app });
    assert.match(help.stdout, /Usage: rstar2/);
    assert.match(help.stdout, /verify \[options\] <file>/);
    assert.equal(sh('npx', ['--no-install', 'rstar2', '--version'], { cwd: app }).stdout.trim(), VERSION);
    // data/recipes resolves next to dist/ (RECIPES_DIR is relative to the compiled module)
    const cfg = sh('npx', ['--no-install', 'rstar2', 'train', '--recipe', 'quickstart', '--print-config'], {
      cwd: app,
    });
    assert.match(cfg.stdout, /stages/);
  });

  test('rstar2 verify scores a JSONL file (worker threads and the CAS from dist/)', () => {
    const lines = [
      { pred: 'so the answer is \\boxed{\\frac{1}{2}}', gold: '0.5' },
      { pred: 'the answer is \\boxed{3}', gold: '4' },
      // only the CAS (@cortex-js/compute-engine, loaded inside a worker thread) reads this one
      { pred: '\\boxed{\\sum_{k=1}^{10} k}', gold: '55' },
    ];
    writeFileSync(join(app, 'answers.jsonl'), lines.map((l) => JSON.stringify(l)).join('\n') + '\n');
    const r = sh('npx', ['--no-install', 'rstar2', 'verify', 'answers.jsonl', '--workers', '1'], {
      cwd: app,
    });
    const out = r.stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    assert.deepEqual(
      out.map((o) => [o.correct, o.matched_by]),
      [
        [true, out[0].matched_by],
        [false, null],
        [true, 'cas-numeric'],
      ],
      r.stderr,
    );
  });

  test('rstar2/reward, rstar2/rl and rstar2/sandbox import from an ESM script', () => {
    writeFileSync(
      join(app, 'use.mjs'),
      `import { verify, scoreTrajectory, VerifierPool } from 'rstar2/reward';
import { groupAdvantages, resampleOnCorrect, DEFAULT_ROC, Rng } from 'rstar2/rl';
import { SandboxClient, SandboxPool } from 'rstar2/sandbox';
const pool = new VerifierPool({ size: 1 });
const [pooled] = await pool.verifyBatch([{ pred: '\\\\boxed{42}', gold: '42' }]);
await pool.close();
console.log(JSON.stringify({
  verify: verify('\\\\boxed{2}', '2').correct,
  score: scoreTrajectory({ text: 'x = \\\\boxed{7}' }, '7').reward,
  pooled: pooled.correct,
  adv: groupAdvantages([1, 0]).map((a) => Math.round(a * 100) / 100),
  roc: resampleOnCorrect([1, 1, 0, 0, 0, 0], [0.5, 0, 0, 0, 0, 0], { ...DEFAULT_ROC, downSampleToN: 4 }, new Rng(1)).keep,
  sandbox: [typeof SandboxClient, typeof SandboxPool.start],
}));
`,
    );
    const r = sh(process.execPath, ['use.mjs'], { cwd: app });
    assert.deepEqual(JSON.parse(r.stdout), {
      verify: true,
      score: 1,
      pooled: true,
      adv: [0.71, -0.71],
      roc: [1, 0, 3, 5], // positives by ascending penalty, then seeded negatives
      sandbox: ['function', 'function'],
    });
  });

  test('the dashboard serves its page code and uPlot (a dependency, resolved from the install)', () => {
    mkdirSync(join(app, 'runs'));
    writeFileSync(
      join(app, 'dash.mjs'),
      `import { startDashboard } from './node_modules/rstar2/dist/dashboard/server.js';
const d = await startDashboard({ root: 'runs', port: 0 });
const files = ['/static/app.js', '/static/style.css', '/static/uPlot.iife.min.js', '/static/uPlot.min.css'];
const got = await Promise.all(files.map(async (f) => {
  const r = await fetch(new URL(f, d.url));
  return [f, r.status, (await r.text()).length > 1000];
}));
await d.close();
console.log(JSON.stringify(got));
`,
    );
    const r = sh(process.execPath, ['dash.mjs'], { cwd: app });
    for (const [f, status, big] of JSON.parse(r.stdout)) assert.deepEqual([status, big], [200, true], f);
  });

  test('the entry points carry .d.ts types a TypeScript consumer resolves', () => {
    writeFileSync(
      join(app, 'use.ts'),
      `import { type VerifyResult, verify } from 'rstar2/reward';
import { groupAdvantages } from 'rstar2/rl';
import { SandboxClient } from 'rstar2/sandbox';
const r: VerifyResult = verify('\\\\boxed{2}', '2');
const a: number[] = groupAdvantages([1, 0]);
const c = new SandboxClient({ url: 'http://127.0.0.1:1' });
// @ts-expect-error verify takes strings (an error here proves the types are real, not any)
verify(2, '2');
export { r, a, c };
`,
    );
    writeFileSync(
      join(app, 'tsconfig.json'),
      JSON.stringify({
        compilerOptions: {
          module: 'nodenext',
          moduleResolution: 'nodenext',
          target: 'es2022',
          strict: true,
          noEmit: true,
          skipLibCheck: true,
          types: ['node'],
          typeRoots: [join(REPO, 'node_modules/@types')],
        },
        files: ['use.ts'],
      }),
    );
    sh(process.execPath, [join(REPO, 'node_modules/typescript/bin/tsc'), '-p', '.'], { cwd: app });
  });

  test('a checkout runs dist/ while it is fresh and the sources once one is edited', () => {
    // mark the built entry point so the output says which tree ran
    writeFileSync(join(stage.dir, 'dist/cli/main.js'), "console.log('ran dist');\n");
    const bin = join(stage.dir, 'bin/rstar2.js');
    const run = () => sh(process.execPath, [bin, '--help'], { cwd: stage.dir }).stdout;
    assert.equal(run().trim(), 'ran dist');
    const later = new Date(Date.now() + 2000);
    utimesSync(join(stage.dir, 'src/rl/roc.ts'), later, later);
    assert.match(run(), /Usage: rstar2/);
  });
});
