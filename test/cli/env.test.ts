import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { test } from 'node:test';
import { findPython } from '../../src/util/python.js';

const BIN = new URL('../../bin/rstar2.js', import.meta.url).pathname;

function env(args: string[], extra: Record<string, string> = {}) {
  const r = spawnSync(process.execPath, [BIN, 'env', ...args], {
    encoding: 'utf8',
    timeout: 120_000,
    env: { ...process.env, ...extra },
  });
  assert.equal(r.status, 0, r.stderr);
  return r.stdout;
}

test('rstar2 env --json reports the worker interpreter as it is: versions read from it, not assumed', {
  timeout: 150_000,
}, () => {
  const py = findPython();
  const direct = spawnSync(
    py,
    [
      '-c',
      'import torch, transformers; print(torch.__version__, transformers.__version__, torch.version.cuda)',
    ],
    {
      encoding: 'utf8',
    },
  );
  assert.equal(direct.status, 0, direct.stderr);
  const [torch, transformers, cuda] = direct.stdout.trim().split(' ');
  const e = JSON.parse(env(['--json']));
  assert.equal(e.worker.path, py);
  assert.equal(e.worker.packages.torch, torch);
  assert.equal(e.worker.packages.transformers, transformers);
  assert.equal(e.worker.cuda, cuda === 'None' ? null : cuda);
  assert.ok(e.worker.backends.includes('gloo'));
  assert.equal(e.sandbox.python.path, findPython(undefined, 'RSTAR2_SANDBOX_PYTHON'));
  assert.ok(e.cpu.cores >= 1 && e.node === process.version);
  // the sandbox probe ran one call: either it worked under a named isolation, or it says why not
  if (e.sandbox.works) assert.match(e.sandbox.isolation, /^(bwrap|landlock)$/);
  else assert.ok(e.sandbox.error.length > 0);
});

test('rstar2 env names a worker interpreter without torch, and one that does not exist, instead of failing', {
  timeout: 60_000,
}, () => {
  const none = JSON.parse(env(['--json', '--no-sandbox'], { RSTAR2_PYTHON: '/nonexistent/python3' }));
  assert.match(none.worker.error, /not found at \/nonexistent\/python3.*bash scripts\/setup.sh/);
  assert.equal(none.sandbox.skipped, '--no-sandbox');
  const bare = env(['--no-sandbox'], { RSTAR2_PYTHON: '/usr/bin/python3' });
  assert.match(bare, /worker Python: \/usr\/bin\/python3 \(3\.\d+\.\d+, RSTAR2_PYTHON\)/);
  assert.match(bare, /error: ModuleNotFoundError: No module named 'torch'/);
  assert.match(bare, /torch: not installed; CUDA: none/);
});
