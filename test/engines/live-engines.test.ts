import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { findPython } from '../../src/util/python.js';

// bench/live-engines.sh behind a stand-in python: `-c import sglang|vllm` answers as told, the servers' entry
// points start the fake servers (fake-engine-main.ts, which read the flags the script passes), anything else is
// the real python (the worker of model init and of the runs). No GPU here, so the trainer is on the CPU and the
// --weight-sync nccl run broadcasts over gloo, which the fakes' ranks join.

const dir = mkdtempSync(join(tmpdir(), 'rstar2-live-test-'));
after(() => rmSync(dir, { recursive: true, force: true }));

function standIn(name: string, imports: string, server: 'fake' | 'dies'): string {
  const start = (api: string) =>
    server === 'fake'
      ? `shift 2; exec node --import tsx test/engines/fake-engine-main.ts ${api} "$@"`
      : 'echo "stand-in: no GPU here" >&2; exit 1';
  const path = join(dir, name);
  writeFileSync(
    path,
    `#!/bin/sh
case "$1 $2" in
  "-c import sglang") case "${imports}" in *sglang*) exit 0;; esac; exit 1 ;;
  "-c import vllm") case "${imports}" in *vllm*) exit 0;; esac; exit 1 ;;
  "-m sglang.launch_server") ${start('sglang')} ;;
  "-m vllm.entrypoints.openai.api_server") ${start('vllm')} ;;
esac
exec ${findPython()} "$@"
`,
  );
  chmodSync(path, 0o755);
  return path;
}

// not spawnSync: the script runs for seconds and the runner's other tests go on meanwhile
const live = (python: string, env: Record<string, string> = {}) =>
  new Promise<{ code: number | null; out: string }>((resolve) => {
    const p = spawn('bash', ['bench/live-engines.sh'], {
      // LIVE_WEIGHTS=0: the fakes hold no weights to compare with the run's
      env: {
        ...process.env,
        RSTAR2_PYTHON: python,
        CUDA_VISIBLE_DEVICES: '',
        TMPDIR: dir,
        LIVE_WEIGHTS: '0',
        ...env,
      },
    });
    let out = '';
    p.stdout.on('data', (c) => (out += c));
    p.stderr.on('data', (c) => (out += c));
    p.on('close', (code) => resolve({ code, out }));
  });

test('live-engines.sh: neither sglang nor vllm imports, so nothing is checked (exit 2), and it says so', async () => {
  const r = await live(standIn('none', '', 'fake'));
  assert.equal(r.code, 2, r.out);
  assert.match(r.out, /sglang does not import in .*: skipped/);
  assert.match(r.out, /vllm does not import in .*: skipped/);
  assert.match(r.out, /neither sglang nor vllm imports in .*: nothing to check/);
});

test('live-engines.sh: both engines, served as the fakes of each: probe, the broadcast (gloo without a GPU) and disk pass', async () => {
  const r = await live(standIn('both', 'sglang vllm', 'fake'));
  assert.equal(r.code, 0, r.out);
  for (const e of ['sglang', 'vllm']) {
    assert.match(r.out, new RegExp(`${e} probe: PASS \\(engine ${e}:.* dtype bfloat16`));
    assert.match(r.out, new RegExp(`${e} nccl: PASS \\(3 broadcasts over gloo; weight sync v2: broadcast`));
    assert.match(r.out, new RegExp(`${e} disk: PASS`));
    // per engine, what ran and how it ended
    assert.match(
      r.out,
      new RegExp(
        `live-engines: ${e} ran: probe PASS, nccl PASS, weights-nccl SKIP, disk PASS, weights-disk SKIP`,
      ),
    );
  }
  assert.match(r.out, /seeds honoured/);
  assert.match(r.out, /logprobs processed_logprobs/);
  assert.match(r.out, /live-engines: all passed \(sglang vllm\)/);
});

test('live-engines.sh: a server that exits at start fails its engine (exit 1) with its log', async () => {
  const r = await live(standIn('dies', 'sglang', 'dies'), { LIVE_START_TIMEOUT: '60' });
  assert.equal(r.code, 1, r.out);
  assert.match(r.out, /vllm does not import/);
  assert.match(r.out, /sglang server: FAIL/);
  assert.match(r.out, /stand-in: no GPU here/);
  assert.match(r.out, /live-engines: FAILED: sglang server/);
});
