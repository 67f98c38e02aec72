import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { findBwrap } from '../../src/sandbox/isolation.js';
import { SandboxPool, type SandboxPoolOptions } from '../../src/sandbox/pool.js';
import type { RunResult } from '../../src/sandbox/types.js';

const skip = findBwrap() ? false : 'bubblewrap not installed';
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('SandboxPool stateful sessions (bwrap)', { skip, timeout: 120_000 }, () => {
  let pool: SandboxPool;
  before(async () => {
    pool = await SandboxPool.start({
      slots: 2,
      maxSessions: 3,
      sessionTtlMs: 60_000,
      timeoutMs: 2000,
      log: () => {},
    });
  });
  after(async () => {
    await pool?.close();
  });

  test('variables, imports, functions and scratch files persist between calls of one session', async () => {
    const a = await pool.run({
      code: 'import math\nx = 41\ndef f(v):\n    return v * 2\nopen("kept.txt", "w").write("hi")',
      session: 'persist',
    });
    assert.equal(a.status, 'ok', a.stderr);
    const b = await pool.run({
      code: 'x += 1\nprint(x, f(x), math.pi > 3, open("kept.txt").read())',
      session: 'persist',
    });
    assert.equal(b.status, 'ok', b.stderr);
    assert.equal(b.stdout, '42 84 True hi\n');
    // an exception or sys.exit in one cell does not end the session
    const c = await pool.run({ code: 'raise ValueError(x)', session: 'persist' });
    assert.equal(c.status, 'error');
    assert.match(c.stderr, /File "<string>", line 1, in <module>\nValueError: 42/);
    const d = await pool.run({ code: 'import sys\nprint("bye")\nsys.exit(3)', session: 'persist' });
    assert.equal(d.exitCode, 3);
    assert.equal(d.stdout, 'bye\n');
    const e = await pool.run({ code: 'print(input(), x)', stdin: 'in\n', session: 'persist' });
    assert.equal(e.stdout, 'in 42\n');
    assert.ok(pool.closeSession('persist'));
    const fresh = await pool.run({ code: 'print("x" in globals())', session: 'persist' });
    assert.equal(fresh.stdout, 'False\n');
    pool.closeSession('persist');
  });

  test('calls on one session run in order, one at a time', async () => {
    const rs = await Promise.all(
      Array.from({ length: 8 }, (_, i) =>
        pool.run({ code: `acc = globals().get("acc", []) + [${i}]\nprint(acc[-1])`, session: 'order' }),
      ),
    );
    assert.deepEqual(
      rs.map((r) => r.stdout),
      Array.from({ length: 8 }, (_, i) => `${i}\n`),
    );
    const last = await pool.run({ code: 'print(acc)', session: 'order' });
    assert.equal(last.stdout, '[0, 1, 2, 3, 4, 5, 6, 7]\n');
    pool.closeSession('order');
  });

  test('sessions are isolated from each other and from stateless calls', async () => {
    await pool.run({
      code: 'import builtins, os\nsecret = 7\nbuiltins.leak = 1\nos.environ["LEAK"] = "1"\nopen("s1.txt", "w").write("x")',
      session: 'iso-a',
    });
    const probe =
      'import builtins, os\nprint("secret" in globals(), hasattr(builtins, "leak"), "LEAK" in os.environ, os.listdir("."), os.getuid())';
    const other = await pool.run({ code: probe, session: 'iso-b' });
    const stateless = await pool.run({ code: probe });
    const self = await pool.run({ code: probe, session: 'iso-a' });
    assert.match(other.stdout, /^False False False \[\] \d+\n$/);
    assert.match(stateless.stdout, /^False False False \[\] \d+\n$/);
    assert.match(self.stdout, /^True True True \['s1.txt'\] \d+\n$/);
    const uid = (r: { stdout: string }) => r.stdout.trim().split(' ').pop();
    if (pool.info.uidBase) {
      assert.notEqual(uid(other), uid(self));
      assert.notEqual(uid(stateless), uid(self));
      // one session cannot read another's scratch dir
      const peek = await pool.run({
        code: 'import os\ntry:\n    print(os.listdir("/scratch"))\n    for d in os.listdir("/scratch"):\n        print(d, os.listdir("/scratch/" + d))\nexcept OSError as e:\n    print("denied")',
        session: 'iso-b',
      });
      assert.doesNotMatch(peek.stdout, /s1\.txt/);
    }
    pool.closeSession('iso-a');
    pool.closeSession('iso-b');
  });

  test('a cell past its wall-clock limit kills the session; the id then reports the loss', async () => {
    await pool.run({ code: 'y = 1', session: 'slow' });
    const t0 = Date.now();
    const r = await pool.run({
      code: 'import time\nprint("start", flush=True)\ntime.sleep(30)',
      session: 'slow',
      timeoutMs: 500,
    });
    assert.ok(Date.now() - t0 < 3000);
    assert.equal(r.status, 'timeout');
    assert.equal(r.timedOut, true);
    assert.equal(r.stdout, 'start\n');
    assert.match(r.error ?? '', /session slow lost: .*time limit/);
    const next = await pool.run({ code: 'print(y)', session: 'slow' });
    assert.equal(next.status, 'error');
    assert.equal(next.exitCode, null);
    assert.match(next.error ?? '', /session slow lost/);
    assert.equal(pool.closeSession('slow'), false); // already dead; forgets the loss
    const fresh = await pool.run({ code: 'print("y" in globals())', session: 'slow' });
    assert.equal(fresh.stdout, 'False\n');
    // a busy loop is stopped the same way
    const busy = await pool.run({ code: 'while True:\n    pass', session: 'slow', timeoutMs: 300 });
    assert.equal(busy.status, 'timeout');
    pool.closeSession('slow');
    assert.equal((await pool.run({ code: 'print(1)' })).stdout, '1\n');
  });

  test('a cell killed at its limit keeps what it printed; one told to flush that ends in time changes no later cell', async () => {
    const r = await pool.run({
      code: 'z = 1\nprint("partial", z)\nwhile True: pass',
      session: 'flush',
      timeoutMs: 1000,
    });
    assert.deepEqual([r.status, r.stdout], ['timeout', 'partial 1\n']);
    pool.closeSession('flush');
    // the flush line-buffers stdout until the kill; a cell that ends first leaves the next one block-buffered.
    // It has the last 100 ms to end in, demoted by then: a loaded host may not run it in time, so it gets 3 tries
    let early: RunResult | undefined;
    for (let i = 0; i < 3; i++) {
      early = await pool.run({
        code: 'import sys, time\nwhile not sys.stdout.line_buffering: time.sleep(0.005)\nprint("flushed")',
        session: 'flush',
        timeoutMs: 1000,
      });
      if (early.status === 'ok') break;
      pool.closeSession('flush');
    }
    assert.deepEqual([early?.status, early?.stdout], ['ok', 'flushed\n']);
    const next = await pool.run({ code: 'import sys\nprint(sys.stdout.line_buffering)', session: 'flush' });
    assert.equal(next.stdout, 'False\n');
    pool.closeSession('flush');
  });

  test('a cell that ends the session process (os._exit, fork bomb) reports the loss', async () => {
    const r = await pool.run({ code: 'import os\nprint("bye", flush=True)\nos._exit(0)', session: 'exit' });
    assert.equal(r.stdout, 'bye\n');
    assert.match(r.error ?? '', /session exit lost: session process exited/);
    const next = await pool.run({ code: 'print(1)', session: 'exit' });
    assert.match(next.error ?? '', /session exit lost/);
    pool.closeSession('exit');
    const bomb = await pool.run({
      code: 'import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass',
      session: 'bomb',
      timeoutMs: 800,
    });
    assert.equal(bomb.status, 'timeout');
    pool.closeSession('bomb');
    const ok = await pool.run({ code: 'import os\nprint(len(os.listdir(".")))', session: 'bomb' });
    assert.equal(ok.stdout, '0\n');
    pool.closeSession('bomb');
  });

  test('closeSession kills a running cell', async () => {
    const p = pool.run({ code: 'import time\ntime.sleep(10)', session: 'closing', timeoutMs: 20_000 });
    await sleep(300);
    assert.equal(pool.closeSession('closing'), true);
    const r = await p;
    assert.notEqual(r.status, 'ok');
    assert.match(r.error ?? '', /session closed/);
    const again = await pool.run({ code: 'print(2)', session: 'closing' });
    assert.equal(again.stdout, '2\n');
    pool.closeSession('closing');
  });

  test('the live-session cap answers busy; closing one makes room', async () => {
    const ids = ['cap-1', 'cap-2', 'cap-3'];
    for (const id of ids) assert.equal((await pool.run({ code: 'v = 1', session: id })).status, 'ok');
    assert.equal(pool.stats().sessions, 3);
    const full = await pool.run({ code: 'print(1)', session: 'cap-4' });
    assert.equal(full.status, 'busy');
    assert.match(full.error ?? '', /session limit/);
    // stateless calls are not affected by full session slots
    assert.equal((await pool.run({ code: 'print(3)' })).stdout, '3\n');
    pool.closeSession('cap-1');
    const ok = await pool.run({ code: 'print(4)', session: 'cap-4' });
    assert.equal(ok.stdout, '4\n');
    for (const id of [...ids, 'cap-4']) pool.closeSession(id);
    assert.equal(pool.stats().sessions, 0);
  });

  /** A one-slot, one-session pool with `opts`, closed after `fn`. */
  async function withSmallPool(opts: SandboxPoolOptions, fn: (p: SandboxPool) => Promise<void>) {
    const small = await SandboxPool.start({ slots: 1, maxSessions: 1, log: () => {}, ...opts });
    try {
      await fn(small);
    } finally {
      await small.close();
    }
  }

  test('output flood kills the session with output_limit', () =>
    withSmallPool({ killOutputBytes: 1 << 16 }, async (small) => {
      await small.run({ code: 'z = 1', session: 'flood' });
      const r = await small.run({ code: 'while True:\n    print("x" * 1000)', session: 'flood' });
      assert.equal(r.status, 'output_limit');
      assert.match(r.error ?? '', /session flood lost/);
    }));

  test('a cell printing past the kept output ends ok (the rest is read slowly) and the session lives on', () =>
    withSmallPool({ maxOutputBytes: 1 << 12 }, async (small) => {
      await small.run({ code: 'z = 7', session: 'much' });
      const r = await small.run({ code: 'import sys\nsys.stdout.write("y" * (3 << 20))', session: 'much' });
      assert.equal(r.status, 'ok', JSON.stringify(r.error));
      assert.equal(r.truncated, true);
      assert.equal(r.stdout.length, 1 << 12);
      assert.equal((await small.run({ code: 'print(z)', session: 'much' })).stdout, '7\n');
    }));
});

describe('SandboxPool session TTL (bwrap)', { skip, timeout: 60_000 }, () => {
  test('an idle session expires; its id reports the expiry until closed', async () => {
    const pool = await SandboxPool.start({ slots: 1, maxSessions: 2, sessionTtlMs: 400, log: () => {} });
    try {
      await pool.run({ code: 'w = 5', session: 'ttl' });
      // activity keeps it alive
      for (let i = 0; i < 3; i++) {
        await sleep(200);
        assert.equal((await pool.run({ code: 'print(w)', session: 'ttl' })).stdout, '5\n');
      }
      await sleep(1000);
      assert.equal(pool.stats().sessions, 0);
      const r = await pool.run({ code: 'print(w)', session: 'ttl' });
      assert.equal(r.status, 'error');
      assert.match(r.error ?? '', /expired after/);
      pool.closeSession('ttl');
      const fresh = await pool.run({ code: 'print("w" in globals())', session: 'ttl' });
      assert.equal(fresh.stdout, 'False\n');
    } finally {
      await pool.close();
    }
  });

  test('maxSessions 0 rejects session calls', async () => {
    const pool = await SandboxPool.start({ slots: 1, maxSessions: 0, log: () => {} });
    try {
      const r = await pool.run({ code: 'print(1)', session: 'x' });
      assert.equal(r.status, 'invalid_input');
    } finally {
      await pool.close();
    }
  });
});
