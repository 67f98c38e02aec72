import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { chmodSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';

// scripts/setup.sh (the README's first step) against stand-in package tools: nothing installed yet, and an apt-get
// that cannot give some packages, as Ubuntu cannot give chromium (a snap) inside a container.
const script = new URL('../../scripts/setup.sh', import.meta.url).pathname;

function run(opts: { refuse: string[]; env?: Record<string, string>; noApt?: boolean }) {
  const bin = mkdtempSync(join(tmpdir(), 'rstar2-setup-'));
  const log = join(bin, 'apt.log');
  const stub = (name: string, body: string) => {
    writeFileSync(join(bin, name), `#!/bin/bash\n${body}\n`);
    chmodSync(join(bin, name), 0o755);
  };
  if (opts.noApt) {
    for (const tool of ['dirname', 'id', 'grep']) symlinkSync(`/usr/bin/${tool}`, join(bin, tool));
  } else {
    stub('dpkg-query', `grep -qx "$3" ${log}.ok 2>/dev/null && echo 'install ok installed' || exit 1`);
    const refuse = opts.refuse.map((p) => `"${p}"`).join(' ');
    stub(
      'apt-get',
      `echo "$*" >> ${log}; [ "$1" = update ] && exit 0
       for a in "$@"; do for r in ${refuse}; do [ "$a" = "$r" ] && exit 100; done; done
       for a in "$@"; do case $a in -*|install) ;; *) echo "$a" >> ${log}.ok;; esac; done`,
    );
  }
  stub('npm', `echo "npm $*" >> ${log}`);
  const r = spawnSync('/bin/bash', [script], {
    encoding: 'utf8',
    env: { PATH: opts.noApt ? bin : `${bin}:/usr/bin:/bin`, HOME: bin, ...opts.env },
  });
  let apt = '';
  try {
    apt = readFileSync(log, 'utf8');
  } catch {}
  rmSync(bin, { recursive: true });
  return { ...r, apt };
}

test('a package this system cannot give: optional ones are skipped with a word, needed ones stop setup', () => {
  const ok = run({ refuse: ['chromium'] });
  assert.equal(ok.status, 0, ok.stderr);
  assert.match(ok.stderr, /could not install chromium \(optional\); the tests that need it are skipped/);
  assert.match(
    ok.apt,
    /install -y -qq --no-install-recommends bubblewrap .*python3-torch .*redis-server chromium/,
  );
  assert.match(ok.apt, /--no-install-recommends redis-server$/m); // one at a time after the batch failed
  const bad = run({ refuse: ['bubblewrap'] });
  assert.equal(bad.status, 1);
  assert.match(bad.stderr, /could not install bubblewrap, which rstar2 needs/);
});

test("RSTAR2_PYTHON with torch (a GPU machine's venv) leaves python3-torch out", () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-py-'));
  const py = join(dir, 'python3');
  writeFileSync(py, '#!/bin/bash\n[ "$1" = -c ] && [ "$2" = "import torch, numpy" ]\n');
  chmodSync(py, 0o755);
  const r = run({ refuse: [], env: { RSTAR2_PYTHON: py } });
  rmSync(dir, { recursive: true });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stderr, /the policy worker's torch is .*python3's; python3-torch not installed/);
  assert.match(r.apt, /bubblewrap/);
  assert.doesNotMatch(r.apt, /python3-torch|libopenblas/);
});

test('no apt-get: setup names what to install and goes on to the npm step', () => {
  const r = run({ refuse: [], noApt: true });
  assert.equal(r.status, 0, r.stderr);
  assert.match(
    r.stderr,
    /no apt-get here, so no system packages installed; rstar2 needs the equivalents of: bubblewrap/,
  );
});
