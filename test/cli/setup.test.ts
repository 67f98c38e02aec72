import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';

// scripts/setup.sh (the README's first step) against stand-in package tools: nothing installed yet, and an apt-get
// that cannot give some packages, as Ubuntu cannot give chromium (a snap) inside a container. The venv's python is
// a stand-in too: `venv` says what it has ('current' or 'empty'), what pip's configuration names and whether the
// configured index answers.
const script = new URL('../../scripts/setup.sh', import.meta.url).pathname;

interface Venv {
  state: 'current' | 'empty';
  pipConfig?: string;
  online?: boolean;
}

function run(opts: { refuse: string[]; env?: Record<string, string>; noApt?: boolean; venv?: Venv }) {
  const bin = mkdtempSync(join(tmpdir(), 'rstar2-setup-'));
  const log = join(bin, 'apt.log');
  const stub = (name: string, body: string) => {
    writeFileSync(join(bin, name), `#!/bin/bash\n${body}\n`);
    chmodSync(join(bin, name), 0o755);
  };
  const venv = opts.venv ?? { state: 'current' };
  mkdirSync(join(bin, 'venv', 'bin'), { recursive: true });
  if (venv.state === 'current') writeFileSync(join(bin, 'venv', 'installed'), '');
  // `python - req` lists what the pins lack; `python -` alone prints the versions
  stub(
    'venv/bin/python',
    `case "$1 $2 $3" in
       "- "*python/requirements.txt*) [ -e ${bin}/venv/installed ] || echo torch==2.13.0 ;;
       "-  ") echo "setup: the policy worker runs python 3.11.2, torch 2.13.0+cpu (CPU)" >&2 ;;
       "-m pip config") echo "${venv.pipConfig ?? ''}" ;;
       "-m pip install") echo "pip $*" >> ${log}; : > ${bin}/venv/installed ;;
       "-c "*) ${venv.online ? 'exit 0' : 'exit 1'} ;;
       *) echo "unexpected python call: $*" >&2; exit 2 ;;
     esac`,
  );
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
    env: {
      PATH: opts.noApt ? bin : `${bin}:/usr/bin:/bin`,
      HOME: bin,
      RSTAR2_VENV: join(bin, 'venv'),
      ...opts.env,
    },
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
    /install -y -qq --no-install-recommends bubblewrap .*python3-venv redis-server chromium/,
  );
  assert.match(ok.apt, /--no-install-recommends redis-server$/m); // one at a time after the batch failed
  const bad = run({ refuse: ['bubblewrap'] });
  assert.equal(bad.status, 1);
  assert.match(bad.stderr, /could not install bubblewrap, which rstar2 needs/);
});

test("RSTAR2_PYTHON with torch (a cluster's conda env) is used as it is: no venv made", () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-py-'));
  const py = join(dir, 'python3');
  writeFileSync(py, '#!/bin/bash\n[ "$1" = -c ] && [ "$2" = "import torch, numpy" ]\n');
  chmodSync(py, 0o755);
  const r = run({ refuse: [], env: { RSTAR2_PYTHON: py } });
  rmSync(dir, { recursive: true });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stderr, /the policy worker runs .*python3 \(RSTAR2_PYTHON\); no venv made/);
  assert.match(r.apt, /bubblewrap/);
  assert.doesNotMatch(r.apt, /python3-torch|pip install/);
  const bad = run({ refuse: [], env: { RSTAR2_PYTHON: '/bin/false' } });
  assert.equal(bad.status, 1);
  assert.match(bad.stderr, /RSTAR2_PYTHON=\/bin\/false cannot import torch and numpy/);
});

test('a venv that holds the pins already is left alone, and pip is not run', () => {
  const r = run({ refuse: [], venv: { state: 'current' } });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stderr, /venv is up to date with python\/requirements.txt/);
  assert.match(r.stderr, /the policy worker runs python 3.11.2, torch 2.13.0/);
  assert.doesNotMatch(r.apt, /pip /);
});

test('an index pip cannot reach: setup uses the configured local index with no retries, not minutes of them', () => {
  const local = mkdtempSync(join(tmpdir(), 'rstar2-index-'));
  try {
    const r = run({
      refuse: [],
      venv: { state: 'empty', pipConfig: `global.extra-index-url='file://${local}'` },
    });
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stderr, /installing into .*venv: torch==2.13.0/);
    assert.match(
      r.stderr,
      /pip's index https:\/\/pypi.org\/simple cannot be reached; using the local index file:/,
    );
    assert.match(
      r.apt,
      new RegExp(
        `pip -m pip install -q --index-url file://${local} --retries 0 --timeout 10 -r python/requirements.txt`,
      ),
    );
    const none = run({ refuse: [], venv: { state: 'empty' } });
    assert.equal(none.status, 1);
    assert.match(none.stderr, /cannot be reached and no local index is configured: set PIP_INDEX_URL/);
    const online = run({ refuse: [], venv: { state: 'empty', online: true } });
    assert.equal(online.status, 0, online.stderr);
    // no GPU here: torch comes from PyTorch's CPU index before the rest of the pins
    assert.match(
      online.apt,
      /pip -m pip install -q --index-url https:\/\/download.pytorch.org\/whl\/cpu torch==2.13.0\npip -m pip install -q -r python\/requirements.txt/,
    );
  } finally {
    rmSync(local, { recursive: true });
  }
});

test('no apt-get: setup names what to install and goes on to the npm step', () => {
  const r = run({ refuse: [], noApt: true });
  assert.equal(r.status, 0, r.stderr);
  assert.match(
    r.stderr,
    /no apt-get here, so no system packages installed; rstar2 needs the equivalents of: bubblewrap/,
  );
});
