// Issue 42, breaks 1, 3, 4 and 5: a forged exit report, memory the per-call bound did not count, Landlock mode's
// host sockets, scratch walk and pid probes, and what one call could see of or share with another.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { chmodSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { findBwrap, SANDBOX_PY_DIR } from '../../src/sandbox/isolation.js';
import { SandboxPool } from '../../src/sandbox/pool.js';
import { descendants } from './helpers.js';

const skip = findBwrap() ? false : 'bubblewrap not installed';
const asRoot = process.getuid?.() === 0 ? false : 'needs root (per-slot uids)';

// broker.py's EXIT frame (zygote.EXIT, "<IiII"): magic b"EXIT", exit code 0, cpu us, rss kb
const FORGE_EXIT =
  'import os, struct\nos.write(3, struct.pack("<IiII", 0x54495845, 0, 0, 0))\nos.closerange(0, 4)\n';

/** Live processes of one uid, seen from the host's /proc (the sandbox's pid namespace is nested in it). */
function processesOf(uid: number): number[] {
  const out: number[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const status = readFileSync(`/proc/${name}/status`, 'utf8');
      if (Number(/^Uid:\s+(\d+)/m.exec(status)?.[1]) === uid && !/^State:\s+Z/m.test(status))
        out.push(Number(name));
    } catch {} // gone meanwhile
  }
  return out;
}

for (const isolation of ['bwrap', 'landlock'] as const) {
  describe(`a call's end and its fetched files are the sandbox's word, not the snippet's (${isolation})`, {
    skip: isolation === 'bwrap' ? skip : asRoot,
    timeout: 60_000,
  }, () => {
    let pool: SandboxPool;
    const logs: string[] = [];
    before(async () => {
      pool = await SandboxPool.start({ isolation, slots: 2, timeoutMs: 1500, log: (l) => logs.push(l) });
    });
    after(() => pool?.close());

    test('an EXIT frame written by the snippet does not end the call: it times out, its slot is freed', async () => {
      const t0 = Date.now();
      const r = await pool.run({ code: `${FORGE_EXIT}import time\ntime.sleep(30)` });
      assert.equal(r.status, 'timeout', JSON.stringify(r));
      assert.ok(Date.now() - t0 >= 1400, `answered after ${Date.now() - t0} ms`);
      // both slots serve again, and nothing of the forger is left
      const rs = await pool.runBatch([{ code: 'print(1)' }, { code: 'print(2)' }]);
      assert.deepEqual(
        rs.map((x) => x.stdout),
        ['1\n', '2\n'],
      );
      assert.equal(pool.stats().restarts, 0, logs.join('\n'));
    });

    test('fetched files come back only under names the request asked for', async () => {
      // a forged result: the snippet writes its own JSON on fd 3 and leaves before the child's real one
      const code =
        'import os\nopen("a.txt", "w").write("A")\n' +
        'os.write(3, b\'{"../../home/user/.bashrc": "eA==", "/etc/x": "eA==", "b.txt": "eA==", "a.txt": "QQ=="}\')\n' +
        'os._exit(0)';
      const r = await pool.run({ code, fetchFiles: ['a.txt'] });
      assert.deepEqual(Object.keys(r.files ?? {}), ['a.txt'], JSON.stringify(r));
      const s = await pool.run({ code, fetchFiles: ['a.txt'], session: 'fetch' });
      assert.ok(
        Object.keys(s.files ?? {}).every((k) => k === 'a.txt'),
        JSON.stringify(s),
      );
    });
  });
}

describe('memory a call pins outside its anonymous pages (bwrap)', {
  skip: skip || asRoot,
  timeout: 60_000,
}, () => {
  let pool: SandboxPool;
  const logs: string[] = [];
  before(async () => {
    pool = await SandboxPool.start({ slots: 2, timeoutMs: 8000, demoteAfterMs: 0, log: (l) => logs.push(l) });
  });
  after(() => pool?.close());

  test('shared anonymous mappings over several forks count against the call: killed as oom', async () => {
    // 4 processes x 100 MB of MAP_SHARED pages (shmem, RssShmem, not RssAnon); each is inside its RLIMIT_AS
    const r = await pool.run({
      code:
        'import mmap, os, time\nfor _ in range(4):\n    if os.fork() == 0:\n' +
        '        m = mmap.mmap(-1, 100 << 20, mmap.MAP_SHARED)\n        for _ in range(100):\n            m.write(b"x" * (1 << 20))\n' +
        '        time.sleep(30)\nprint("forked", flush=True)\ntime.sleep(30)',
      memoryMb: 200,
    });
    assert.equal(r.status, 'oom', JSON.stringify({ ...r, logs }));
    assert.match(r.error ?? '', /memory limit/);
  });

  test("memfd_create is refused (its pages are in no process's RSS), so numbers of them cannot pin memory", async () => {
    const r = await pool.run({
      code:
        'import os\ntry:\n    fd = os.memfd_create("x")\n    os.write(fd, b"x" * (64 << 20))\n    print("made")\n' +
        'except OSError as e:\n    print("refused", e.errno)',
      memoryMb: 32,
    });
    assert.equal(r.stdout, 'refused 1\n', JSON.stringify(r));
  });

  test("a session's leftover processes do not outlive the cell that forked them", async () => {
    const cell = await pool.run({
      code:
        'import os, time\nif os.fork() == 0:\n    b = bytearray(100 << 20)\n    time.sleep(60)\n    os._exit(0)\n' +
        'print(os.getuid())',
      session: 'leftover',
    });
    assert.equal(cell.status, 'ok', JSON.stringify(cell));
    const uid = Number(cell.stdout);
    let left: number[] = [];
    for (let i = 0; i < 20; i++) {
      await new Promise((r) => setTimeout(r, 100));
      left = processesOf(uid);
      if (left.length <= 1) break;
    }
    assert.equal(left.length, 1, `processes of the session's uid after its cell: ${left}`); // the session's own
    const next = await pool.run({ code: 'print("alive")', session: 'leftover' });
    assert.equal(next.stdout, 'alive\n', JSON.stringify(next));
  });
});

describe('isolation landlock: no host sockets, pids or scratch walk to lean on', {
  skip: asRoot,
  timeout: 90_000,
}, () => {
  let pool: SandboxPool | undefined;
  let why = '';
  const logs: string[] = [];
  before(async () => {
    try {
      pool = await SandboxPool.start({
        isolation: 'landlock',
        slots: 4,
        timeoutMs: 4000,
        demoteAfterMs: 0, // a shared host starves demoted calls, and the walk test's calls run long
        log: (l) => logs.push(l),
      });
    } catch (e) {
      why = (e as Error).message;
    }
  });
  after(() => pool?.close());

  test('a world-writable pathname UNIX socket of the host cannot be reached', async (t) => {
    if (!pool) return t.skip(why);
    const dir = mkdtempSync(join(tmpdir(), 'rstar2-host-sock-'));
    chmodSync(dir, 0o755);
    const path = join(dir, 's');
    let met = 0;
    const server = createServer((c) => {
      met++;
      c.destroy();
    });
    await new Promise<void>((r) => server.listen(path, r));
    chmodSync(path, 0o777);
    const dgram = join(dir, 'd');
    const py = spawn(
      '/usr/bin/python3',
      [
        '-c',
        `import socket, os, sys\ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\ns.bind(${JSON.stringify(dgram)})\n` +
          `os.chmod(${JSON.stringify(dgram)}, 0o777)\nprint("up", flush=True)\ns.settimeout(5)\n` +
          'try:\n    print("got", s.recv(10), flush=True)\nexcept OSError:\n    print("none", flush=True)',
      ],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    let pyOut = '';
    py.stdout.on('data', (d) => (pyOut += d));
    while (!pyOut.includes('up')) await new Promise((r) => setTimeout(r, 20));
    try {
      const r = await pool.run({
        code:
          `import socket\nc = socket.socket(socket.AF_UNIX)\ntry:\n    c.connect(${JSON.stringify(path)})\n    print("connected")\n` +
          'except OSError as e:\n    print("refused", e.errno)\n' +
          `d = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\ntry:\n    d.sendto(b"hi", ${JSON.stringify(dgram)})\n    print("sent")\n` +
          'except OSError as e:\n    print("refused", e.errno)\n' +
          `import array\ntry:\n    d.sendmsg([b"hi"], [], 0, ${JSON.stringify(dgram)})\n    print("sent")\n` +
          'except OSError as e:\n    print("refused", e.errno)',
      });
      assert.match(r.stdout, /^refused \d+\nrefused \d+\nrefused \d+\n$/, JSON.stringify(r));
      assert.equal(met, 0);
      // what programs use between their own processes still works
      const pair = await pool.run({
        code: 'import socket\na, b = socket.socketpair()\na.sendall(b"ok")\nprint(b.recv(2).decode())',
      });
      assert.equal(pair.stdout, 'ok\n', JSON.stringify(pair));
    } finally {
      py.kill();
      server.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('host pids cannot be told from unused ones', async (t) => {
    if (!pool) return t.skip(why);
    // pid 1 exists on every host; 4194301 is past the default pid_max (4194304) minus a margin and never used here
    const r = await pool.run({
      code:
        'import os\ndef probe(pid):\n    out = []\n' +
        '    for f in (os.getsid, os.getpgid, os.sched_getaffinity, os.sched_getscheduler, os.sched_getparam,\n' +
        '              lambda p: os.getpriority(os.PRIO_PROCESS, p), os.pidfd_open):\n' +
        '        try:\n            f(pid)\n            out.append("found")\n        except OSError as e:\n' +
        '            out.append(e.errno)\n    return out\nprint(probe(1) == probe(4194301), probe(1))',
    });
    assert.match(r.stdout, /^True /, JSON.stringify(r));
  });

  test("calls sitting on many files do not make the broker's scratch walk eat a core", async (t) => {
    if (!pool) return t.skip(why);
    const p = pool;
    const brokerPid = (p as unknown as { broker: { proc: { pid: number } } }).broker.proc.pid;
    const cpuMs = () => {
      const f = readFileSync(`/proc/${brokerPid}/stat`, 'utf8').split(') ')[1].split(' ');
      return (Number(f[11]) + Number(f[12])) * 10;
    };
    const hold =
      'import os, time\nfor i in range(9000):\n    open(f"f{i}", "w").close()\ntime.sleep(6)\nprint("held")';
    const calls = [0, 1, 2].map(() => p.run({ code: hold, timeoutMs: 15_000 }));
    await new Promise((r) => setTimeout(r, 3000)); // the files are made
    const c0 = cpuMs();
    const t0 = Date.now();
    await new Promise((r) => setTimeout(r, 2000));
    const share = (cpuMs() - c0) / (Date.now() - t0);
    const rs = await Promise.all(calls);
    assert.ok(share < 0.15, `the broker used ${(share * 100).toFixed(0)} % of a core`);
    assert.deepEqual(
      rs.map((r) => r.stdout),
      ['held\n', 'held\n', 'held\n'],
    );
  });
});

describe('between concurrent calls (bwrap)', { skip: skip || asRoot, timeout: 60_000 }, () => {
  let pool: SandboxPool;
  before(async () => {
    pool = await SandboxPool.start({ slots: 3, timeoutMs: 4000 });
  });
  after(() => pool?.close());

  // the broker remounts the sandbox's /proc with hidepid=2 before any request, then drops CAP_SYS_ADMIN
  test("/proc shows a call none of another call's processes", async () => {
    const marker =
      'import time\nopen("/proc/self/comm", "w").write("rstar2-mark")\nprint("up", flush=True)\ntime.sleep(1.5)';
    const probe =
      'import os, time\ntime.sleep(0.4)\nme = os.getuid()\nseen = []\nfor p in filter(str.isdigit, os.listdir("/proc")):\n' +
      '    try:\n        s = open(f"/proc/{p}/status").read()\n    except OSError:\n        continue\n' +
      '    if int(s.split("Uid:")[1].split()[0]) != me:\n        seen.append(s.split("\\n")[0])\nprint(seen)';
    const [, b] = await pool.runBatch([{ code: marker }, { code: probe }]);
    assert.equal(b.stdout, '[]\n', JSON.stringify(b));
    // and no process of the sandbox kept the capability the remount took
    const bwrapPid = (pool as unknown as { broker: { proc: { pid: number } } }).broker.proc.pid;
    const inside = descendants(bwrapPid);
    assert.ok(inside.length >= 3, `found ${inside}`); // broker, zygote, wiper
    let checked = 0;
    for (const pid of inside) {
      let status: string;
      try {
        status = readFileSync(`/proc/${pid}/status`, 'utf8');
      } catch (e) {
        // a call's child that exited between the listing and this read holds nothing any more
        if ((e as NodeJS.ErrnoException).code === 'ENOENT' || (e as NodeJS.ErrnoException).code === 'ESRCH')
          continue;
        throw e;
      }
      checked++;
      const caps = /^CapPrm:\s+([0-9a-f]+)/m.exec(status)?.[1] ?? '0';
      assert.equal((BigInt(`0x${caps}`) >> 21n) & 1n, 0n, `process ${pid} holds CAP_SYS_ADMIN (${caps})`);
    }
    assert.ok(checked >= 3, `read ${checked} of ${inside}`); // the long-lived three at least
  });

  test('mountinfo names no host path', async () => {
    const r = await pool.run({ code: 'print(open("/proc/self/mountinfo").read())' });
    assert.equal(r.status, 'ok', JSON.stringify(r));
    assert.ok(!r.stdout.includes(SANDBOX_PY_DIR), r.stdout);
  });

  test('two calls cannot meet on a socket in a scratch one of them opened to all', async () => {
    const server =
      'import os, socket\ntry:\n    os.chmod(".", 0o777)\nexcept OSError:\n    pass\n' +
      's = socket.socket(socket.AF_UNIX)\ns.bind("meet")\nos.chmod("meet", 0o777)\ns.listen()\ns.settimeout(1.5)\n' +
      'try:\n    s.accept()\n    print("met")\nexcept OSError:\n    print("alone")';
    const client =
      'import socket, time\ntime.sleep(0.4)\nout = "alone"\nfor p in [f"/scratch/{i}/meet" for i in range(40)]:\n' +
      '    c = socket.socket(socket.AF_UNIX)\n    try:\n        c.connect(p)\n        out = "met"\n    except OSError:\n' +
      '        pass\nprint(out)';
    const [a, b] = await pool.runBatch([{ code: server }, { code: client }]);
    assert.equal(a.stdout, 'alone\n', JSON.stringify(a));
    assert.equal(b.stdout, 'alone\n', JSON.stringify(b));
  });

  test('memfd_secret and cachestat are refused', async () => {
    const r = await pool.run({
      code:
        'import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nfd = os.open(".", os.O_RDONLY)\n' +
        'rng, cs = ctypes.create_string_buffer(16), ctypes.create_string_buffer(64)\n' +
        'for nr, args in ((447, (0,)), (451, (fd, rng, cs, 0))):\n' +
        '    print(nr, libc.syscall(nr, *args), ctypes.get_errno())',
    });
    assert.equal(r.stdout, '447 -1 1\n451 -1 1\n', JSON.stringify(r));
  });
});
