import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { PolicyWorker } from '../../src/worker/index.js';
import { sampling, TEST_CONFIG } from './helpers.js';

test('a killed worker rejects the pending call with the signal and stderr tail, then restarts', {
  timeout: 120_000,
}, async () => {
  const w = await PolicyWorker.start({ threads: 1 });
  try {
    await w.init(TEST_CONFIG, 9);
    const before = (await w.logprobs([[1, 2, 3, 4]]))[0].logprobs;
    const pid = w.pids[0];
    const long = w.generate(
      Array.from({ length: 16 }, () => [1, 2, 3]),
      sampling({ maxNewTokens: 3000 }),
    );
    setTimeout(() => process.kill(pid, 'SIGKILL'), 300);
    await assert.rejects(long, /died with signal SIGKILL/);
    // the next call restarts the process and replays the last init
    const after = (await w.logprobs([[1, 2, 3, 4]]))[0].logprobs;
    assert.notEqual(w.pids[0], pid);
    assert.equal(w.restarts, 1);
    assert.deepEqual(after, before);
    // the engine's load question brings a dead worker back too (a scheduler polls it, and would otherwise keep
    // the engine down with no generate left to restart it)
    const second = w.pids[0];
    process.kill(second, 'SIGKILL');
    await new Promise((r) => setTimeout(r, 300)); // its exit reaches the client
    assert.ok((await w.engineLoad()).capacityTokens > 0);
    assert.notEqual(w.pids[0], second);
    assert.equal(w.restarts, 2);
  } finally {
    await w.close();
  }
});

test('the worker runs in a session of its own and outlives a SIGINT; closing its stdin ends it mid-generate', {
  timeout: 120_000,
}, async () => {
  const group = (pid: number) =>
    Number(
      readFileSync(`/proc/${pid}/stat`, 'utf8')
        .replace(/^.*\) /s, '')
        .split(' ')[2],
    );
  const w = await PolicyWorker.start({ threads: 1 });
  try {
    await w.init(TEST_CONFIG, 9);
    const pid = w.pids[0];
    assert.equal(group(pid), pid, 'it leads its own process group');
    assert.notEqual(group(pid), group(process.pid), "a terminal's Ctrl-C to our group does not reach it");
    const long = w.generate([[1, 2, 3]], sampling({ maxNewTokens: 30000 }));
    await new Promise((r) => setTimeout(r, 300));
    const gone = new Promise<number | null>((res) => {
      const poll = setInterval(() => {
        try {
          process.kill(pid, 0);
        } catch {
          clearInterval(poll);
          res(Date.now());
        }
      }, 20);
    });
    const t0 = Date.now();
    (w as unknown as { ranks: { child: { stdin: { end(): void } } }[] }).ranks[0].child.stdin.end();
    await assert.rejects(long, /died|exit/);
    assert.ok(((await gone) ?? 0) - t0 < 10_000, 'it left without generating its 30,000 tokens');
  } finally {
    await w.close();
  }
});

test('calls queued behind a dying call are all answered', { timeout: 120_000 }, async () => {
  const w = await PolicyWorker.start({ threads: 1 });
  try {
    await w.init(TEST_CONFIG, 9);
    const pid = w.pids[0];
    const a = w.generate([[1]], sampling({ maxNewTokens: 4000 }));
    const b = w.logprobs([[1, 2]]);
    setTimeout(() => process.kill(pid, 'SIGKILL'), 300);
    await assert.rejects(a, /SIGKILL/);
    const rb = await b; // runs on the restarted worker
    assert.equal(rb[0].logprobs.length, 2);
  } finally {
    await w.close();
  }
});

test('missing torch and a protocol version mismatch fail start() with a clear message', {
  timeout: 60_000,
}, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-notorch-'));
  try {
    mkdirSync(join(dir, 'torch'));
    writeFileSync(
      join(dir, 'torch', '__init__.py'),
      "raise ImportError('No module named torch (simulated)')\n",
    );
    await assert.rejects(PolicyWorker.start({ env: { PYTHONPATH: dir } }), /Run `bash scripts\/setup.sh`/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  await assert.rejects(
    PolicyWorker.start({ env: { RSTAR2_WORKER_FAKE_VERSION: '99' } }),
    /protocol version mismatch: this client speaks v4, python\/rstar2_worker speaks v99/,
  );
  await assert.rejects(PolicyWorker.start({ python: '/nonexistent/python3' }), /not found/);
});

test('a call that does not answer within callTimeoutMs is rejected, the worker killed and restarted', {
  timeout: 120_000,
}, async () => {
  const w = await PolicyWorker.start({ threads: 1 });
  try {
    await w.init(TEST_CONFIG, 9);
    const pid = w.pids[0];
    w.callTimeoutMs = 300;
    await assert.rejects(
      w.generate([[1]], sampling({ maxNewTokens: 20000 })),
      /call 'generate' did not answer within 300 ms/,
    );
    w.callTimeoutMs = 0;
    const r = await w.logprobs([[1, 2]]);
    assert.equal(r[0].logprobs.length, 2);
    assert.notEqual(w.pids[0], pid);
  } finally {
    await w.close();
  }
});
