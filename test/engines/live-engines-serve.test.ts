import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { findPython } from '../../src/util/python.js';

// bench/live-engines.sh on rstar2's own server (LIVE_ENGINES=rstar2), for real on this CPU: probe, the
// --weight-sync nccl run (no GPU: the CPU trainer broadcasts over gloo, the initial push and one per update), the
// disk run, and after each the served log-probs checked against the run's last checkpoint. What gpu-check runs on
// a GPU, where the same run broadcasts over NCCL.

const dir = mkdtempSync(join(tmpdir(), 'rstar2-live-serve-'));
after(() => rmSync(dir, { recursive: true, force: true }));

test('live-engines.sh on rstar2 serve: probe, both runs, and the served weights are the trained ones', {
  timeout: 840_000,
}, async () => {
  const r = await new Promise<{ code: number | null; out: string }>((resolve) => {
    const p = spawn('bash', ['bench/live-engines.sh'], {
      env: {
        ...process.env,
        RSTAR2_PYTHON: findPython(),
        LIVE_ENGINES: 'rstar2',
        CUDA_VISIBLE_DEVICES: '',
        TMPDIR: dir,
        LIVE_RUN_TIMEOUT: '600',
      },
    });
    let out = '';
    p.stdout.on('data', (c) => (out += c));
    p.stderr.on('data', (c) => (out += c));
    p.on('close', (code) => resolve({ code, out }));
  });
  assert.equal(r.code, 0, r.out);
  assert.match(r.out, /rstar2 probe: PASS \(engine sglang:\S+: version \S+, dtype float32, .*seeds honoured/);
  // 2 steps: the first rollout's push of the trainer's weights, then one after each update
  assert.match(r.out, /rstar2 nccl: PASS \(3 broadcasts over gloo; weight sync v2: broadcast \d+ tensors/);
  for (const run of ['nccl', 'disk'])
    assert.match(
      r.out,
      new RegExp(
        `rstar2 weights-${run}: PASS \\(served-weights: PASS: .*run-${run}/checkpoints/\\S+: max \\|Δ logprob\\| `,
      ),
    );
  assert.match(
    r.out,
    /live-engines: rstar2 ran: probe PASS, nccl PASS, weights-nccl PASS, disk PASS, weights-disk PASS/,
  );
});
