// Hostile snippets against the fully isolated pool: each must get a clear per-item result, and the pool
// must keep serving (a normal call succeeds after every attack) without restarting the sandbox.
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:net';
import { after, before, describe, test } from 'node:test';
import { findBwrap } from '../../src/sandbox/isolation.js';
import { SandboxPool } from '../../src/sandbox/pool.js';
import type { RunResult } from '../../src/sandbox/types.js';

const SECRET = 'rstar2-secret-value-7f3a9c';
const skip = findBwrap() ? false : 'bubblewrap not installed';

describe('sandbox attacks (bwrap)', { skip, timeout: 170_000 }, () => {
  let pool: SandboxPool;
  const logs: string[] = [];

  before(async () => {
    process.env.RSTAR2_TEST_SECRET = SECRET;
    pool = await SandboxPool.start({ slots: 4, timeoutMs: 2000, log: (l) => logs.push(l) });
  });
  after(async () => {
    delete process.env.RSTAR2_TEST_SECRET;
    await pool?.close();
  });

  async function attack(
    code: string,
    extra: Partial<Parameters<SandboxPool['run']>[0]> = {},
  ): Promise<RunResult> {
    const r = await pool.run({ code, ...extra });
    const ok = await pool.run({ code: 'print(6*7)' });
    assert.equal(ok.status, 'ok', `pool stopped serving after an attack: ${JSON.stringify(ok)}`);
    assert.equal(ok.stdout, '42\n');
    assert.equal(pool.stats().restarts, 0, `sandbox restarted: ${logs.join('\n')}`);
    return r;
  }

  test('fork bomb is contained by NPROC and the wall clock', async () => {
    const r = await attack(
      'import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n',
    );
    assert.equal(r.status, 'timeout');
    assert.equal(r.timedOut, true);
    // a slot's uid never has more than one live process (its call, or the spare waiting for one): anything
    // more is a survivor of the bomb
    const perUid = await pool.run({
      code:
        'import os, collections\nc = collections.Counter()\nfor p in filter(str.isdigit, os.listdir("/proc")):\n' +
        '    try:\n        c[open(f"/proc/{p}/status").read().split("Uid:")[1].split()[0]] += 1\n' +
        '    except (OSError, IndexError):\n        pass\nprint(max(n for u, n in c.items() if u != "0"))',
    });
    assert.equal(perUid.stdout, '1\n', `most processes of one slot uid: ${perUid.stdout}${perUid.stderr}`);
  });

  test('4 GiB allocation fails as oom', async () => {
    const r = await attack('b = bytearray(4 << 30)\nprint(len(b))');
    assert.equal(r.status, 'oom');
    assert.equal(r.oom, true);
    assert.match(r.stderr, /MemoryError/);
  });

  test('signal.alarm(0) plus an infinite loop still times out', async () => {
    const r = await attack('import signal\nsignal.alarm(0)\nwhile True:\n    pass\n');
    assert.equal(r.status, 'timeout');
    assert.ok(r.wallMs >= 2000 && r.wallMs < 4000, `wall ${r.wallMs}`);
  });

  test('sleeping past the limit times out (CPU limits alone would not catch it)', async () => {
    const r = await attack('import time\ntime.sleep(60)');
    assert.equal(r.status, 'timeout');
  });

  test('double-forked setsid daemon is killed when the call ends', async () => {
    const r = await attack(
      'import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n' +
        '        open("/proc/self/comm", "w").write("evildaemon")\n        time.sleep(100)\n    os._exit(0)\n' +
        'time.sleep(0.2)\nprint("parent done")',
    );
    assert.equal(r.status, 'ok');
    const ps = await pool.run({
      code:
        'import os\nnames = []\nfor p in os.listdir("/proc"):\n    if p.isdigit():\n        try:\n' +
        '            names.append(open(f"/proc/{p}/comm").read().strip())\n        except OSError:\n            pass\nprint(names)',
    });
    assert.equal(ps.status, 'ok');
    assert.doesNotMatch(ps.stdout, /evildaemon/);
  });

  test('no network: 127.0.0.1 and a real listening TCP server are unreachable', async () => {
    let connections = 0;
    const server: Server = createServer((s) => {
      connections++;
      s.destroy();
    });
    await new Promise<void>((res) => server.listen(0, '127.0.0.1', () => res()));
    const port = (server.address() as { port: number }).port;
    try {
      const r = await attack(
        `import socket\ns = socket.create_connection(("127.0.0.1", ${port}), timeout=1)\nprint("connected")`,
      );
      assert.equal(r.status, 'error');
      assert.doesNotMatch(r.stdout, /connected/);
      const udp = await attack(
        'import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", 53))',
      );
      assert.equal(udp.status, 'error');
      assert.equal(connections, 0);
    } finally {
      server.close();
    }
  });

  test('/etc/shadow and the service environment are not readable', async () => {
    const r = await attack('print(open("/etc/shadow").read())');
    assert.equal(r.status, 'error');
    assert.match(r.stderr, /FileNotFoundError|PermissionError/);
    const env = await attack(
      'import os\nprint(dict(os.environ))\nfor p in os.listdir("/proc"):\n    if p.isdigit():\n        try:\n' +
        '            print(open(f"/proc/{p}/environ", "rb").read())\n        except OSError as e:\n            print(p, e)',
    );
    assert.equal(env.status, 'ok');
    assert.ok(!env.stdout.includes(SECRET), 'secret leaked into the sandbox');
    const proj = await attack('import os\nprint(os.listdir("/work"))');
    assert.equal(proj.status, 'error');
  });

  test('writes outside scratch fail', async () => {
    const r = await attack(
      'import os\nres = []\nfor p in ["/tmp/x", "/usr/lib/python3/x", "/opt/rstar2-sandbox/server.py", "/etc/x", "/x", "/dev/x", "/scratch/1/x"]:\n' +
        '    try:\n        open(p, "w").write("pwned")\n        res.append(p)\n    except OSError:\n        pass\nprint(res)\n' +
        'open("mine.txt", "w").write("ok")\nprint(os.path.exists("mine.txt"))',
    );
    assert.equal(r.status, 'ok');
    assert.equal(r.stdout, '[]\nTrue\n');
  });

  test('filling the disk stops at the scratch quota and the scratch is wiped', async () => {
    const r = await attack(
      'import os\nn = 0\ntry:\n    for i in range(40):\n        with open(f"f{i}", "wb") as f:\n' +
        '            f.write(b"x" * (15 << 20))\n        n += 1\nexcept OSError as e:\n    print("stopped", n, e.errno)\n',
    );
    assert.equal(r.status, 'ok');
    assert.match(r.stdout, /^stopped \d+ (28|27)\n$/); // ENOSPC or EFBIG
    const after = await pool.run({ code: 'import os\nprint(sorted(os.listdir(".")))' });
    assert.equal(after.stdout, '[]\n');
  });

  test('printing 100 MB is cut off with output_limit', async () => {
    const r = await attack('import sys\nfor _ in range(100):\n    sys.stdout.write("y" * (1 << 20))\n');
    assert.equal(r.status, 'output_limit');
    assert.equal(r.truncated, true);
    assert.ok(r.stdout.length <= 1 << 20);
  });

  test('killing the parent or everything (kill -9 -1) hurts only the snippet', async () => {
    const r = await attack('import os\nos.kill(os.getppid(), 9)');
    assert.equal(r.status, 'error');
    assert.match(r.stderr, /PermissionError/);
    const all = await attack('import os\nos.kill(-1, 9)\nprint("survived")');
    // Linux's kill(-1) spares the caller; every other process is out of the slot uid's reach
    assert.equal(all.status, 'ok');
    assert.equal(all.stdout, 'survived\n');
    const sh = await attack('import subprocess\nsubprocess.run(["kill", "-9", "-1"])\nprint("after")');
    assert.ok(['killed', 'ok', 'error'].includes(sh.status));
  });

  test('binary output is decoded lossily', async () => {
    const r = await attack('import sys\nsys.stdout.buffer.write(bytes(range(256)))');
    assert.equal(r.status, 'ok');
    assert.ok(r.stdout.includes('\ufffd'));
  });

  test('a 10 MB code string runs', async () => {
    const r = await attack(`x = "${'a'.repeat(10_000_000)}"\nprint(len(x))`);
    assert.equal(r.status, 'ok');
    assert.equal(r.stdout, '10000000\n');
  });

  test('concurrent snippets cannot meet on an abstract unix socket', async () => {
    const server =
      'import socket, time\ns = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\ns.bind("\\0rstar2-meet")\n' +
      's.listen()\ns.settimeout(1.5)\ntry:\n    s.accept()\n    print("met")\nexcept OSError as e:\n    print("alone")';
    const client =
      'import socket, time\ntime.sleep(0.3)\nc = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n' +
      'try:\n    c.connect("\\0rstar2-meet")\n    print("met")\nexcept OSError as e:\n    print("blocked", e.errno)';
    const [a, b] = await pool.runBatch([{ code: server }, { code: client }]);
    assert.equal(a.stdout, 'alone\n');
    assert.match(b.stdout, /^blocked/);
  });
});
