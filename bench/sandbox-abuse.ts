// Innocent calls next to hostile ones. Measures the idle p50/p99 of a trivial call (before and after), and runs
// a mixed stream for --seconds: --hostile workers loop over the attacks below while --innocent workers send
// trivial calls; prints the innocent calls' success rate and p50/p99 latency, and each attack's outcomes.
// Targets (issue 17): 100 % innocent success, innocent p99 within 3x the idle p99, no sandbox restart.
//
//   npx tsx bench/sandbox-abuse.ts [--seconds 30] [--slots N (default: the pool's)] [--hostile 2] [--innocent 2] [--demote-after-ms 50]
//                                [--attacks 'busy loop,fork bomb'] [--long-call] [--host-loop] [--host-busy N]
// (--demote-after-ms 0: long calls keep their priority, as before the pool demoted them)
// --long-call: what demotion costs an honest long call instead: a ~0.4 s computation alone, then beside
// --innocent workers sending trivial calls (no attacks)
// RSTAR2_SANDBOX_ISOLATION=landlock in the environment: the same against the sandbox without namespaces
// --host-busy N: a host loaded by other work, as a rollout node is: N busy loops outside the sandbox at the default
// priority, each a session of its own, for the whole run (baselines too)
// --host-loop: what this host's scheduler allows at best: no hostile calls, but --hostile busy loops outside the
// sandbox at the lowest priority there is (nice 19, each in a session of autogroup nice 19) beside the innocent workers
import { spawn } from 'node:child_process';
import { cpus } from 'node:os';
import { SandboxPool } from '../src/sandbox/pool.js';
import type { RunRequest } from '../src/sandbox/types.js';
import { benchArgs } from './args.js';

const { values } = benchArgs(import.meta.url, {
  options: {
    seconds: { type: 'string', default: '30' },
    slots: { type: 'string' },
    hostile: { type: 'string', default: '2' },
    innocent: { type: 'string', default: '2' },
    'demote-after-ms': { type: 'string', default: '50' },
    attacks: { type: 'string' }, // a comma-separated subset of the attacks below, e.g. 'busy loop,fork bomb'
    'long-call': { type: 'boolean', default: false },
    'host-loop': { type: 'boolean', default: false },
    'host-busy': { type: 'string', default: '0' },
  },
});
const seconds = Number(values.seconds);
const [hostileN, innocentN] = [values.hostile, values.innocent].map(Number);
const slots = values.slots === undefined ? undefined : Number(values.slots);
const hostBusy = Number(values['host-busy']);
if (!(Number.isInteger(hostBusy) && hostBusy >= 0)) throw new Error('--host-busy must be an integer >= 0');
for (const [k, v] of Object.entries({ seconds, slots: slots ?? 1, hostile: hostileN, innocent: innocentN }))
  if (!(Number.isFinite(v) && v > 0)) throw new Error(`--${k} must be a positive number`);

const ATTACKS: Record<string, RunRequest> = {
  'deep dirs': {
    code: 'import os\nfor i in range(1100):\n    os.mkdir("a")\n    os.chdir("a")\nprint("ok")',
  },
  '50k files': { code: 'for i in range(50000):\n    open(str(i), "w").close()' },
  'fork memory': {
    code:
      'import os, time\nfor i in range(3):\n    if os.fork() == 0:\n        b = b"x" * (500 << 20)\n' +
      '        time.sleep(2)\n        os._exit(0)\ntime.sleep(2)',
    timeoutMs: 4000,
  },
  'shm fill': {
    // names of its own: with fixed ones, concurrent calls in other slots collided (EACCES under umask 077) and the
    // attack was only a stream of calls failing at once
    code: 'import os\nfor i in range(8):\n    open(f"/dev/shm/f{os.getpid()}-{i}", "wb").write(b"x" * (16 << 20))',
  },
  'fork bomb': {
    code: 'import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass',
  },
  'session bomb': {
    code: 'import os\nwhile True:\n    try:\n        if os.fork() == 0:\n            os.setsid()\n    except OSError:\n        pass',
  },
  'output flood': { code: 'while True:\n    print("x" * 10000)' },
  'busy loop': { code: 'while True:\n    pass', timeoutMs: 1000 },
  'kill -1': { code: 'import os, signal\nos.kill(-1, signal.SIGKILL)' },
  // issue 42: a forged exit report (then a sleep that must still be clocked), memory outside RssAnon (shared
  // mappings over forks, memfd), calls sitting on many files (the scratch walk), a scratch opened to others
  'forged exit': {
    code: 'import os, struct, time\nos.write(3, struct.pack("<IiII", 0x54495845, 0, 0, 0))\nos.closerange(0, 4)\ntime.sleep(30)',
    timeoutMs: 1000,
  },
  'shared mappings': {
    code:
      'import mmap, os, time\nfor _ in range(4):\n    if os.fork() == 0:\n        m = mmap.mmap(-1, 100 << 20, mmap.MAP_SHARED)\n' +
      '        for _ in range(100):\n            m.write(b"x" * (1 << 20))\n        time.sleep(2)\n        os._exit(0)\ntime.sleep(2)',
    memoryMb: 200,
    timeoutMs: 3000,
  },
  memfd: { code: 'import os\nfd = os.memfd_create("x")\nos.write(fd, b"x" * (256 << 20))' },
  'sit on 9k files': {
    code: 'import time\nfor i in range(9000):\n    open(f"f{i}", "w").close()\ntime.sleep(2)',
    timeoutMs: 4000,
  },
  // issue 42, round 4: a session cell that says "done" itself and spins on (its session is closed 1 s later), memory
  // pinned in unread socket buffers over forks
  'forged cell end': {
    code: 'import os, struct, time\nos.write(3, b"D" + struct.pack("<iII", 0, 0, 0))\nt = time.time()\nwhile time.time() - t < 30:\n    pass',
    session: 'forger',
  },
  'socket buffers': {
    code:
      'import os, socket, time\nfor _ in range(8):\n    if os.fork() == 0:\n        keep = []\n        for _ in range(100):\n' +
      '            a, b = socket.socketpair()\n            a.setblocking(False)\n            try:\n                while True:\n' +
      '                    a.send(b"x" * 65536)\n            except BlockingIOError:\n                pass\n            keep.append((a, b))\n' +
      '        time.sleep(2)\n        os._exit(0)\ntime.sleep(2)',
    memoryMb: 128,
    timeoutMs: 3000,
  },
  'open scratch': {
    code:
      'import os, socket\ntry:\n    os.chmod(".", 0o777)\nexcept OSError:\n    pass\ns = socket.socket(socket.AF_UNIX)\n' +
      's.bind("meet")\nos.chmod("meet", 0o777)\ns.listen()\ns.settimeout(0.5)\ntry:\n    s.accept()\nexcept OSError:\n    pass',
  },
};
const INNOCENT: RunRequest = { code: 'print(6*7)' };
const LONG: RunRequest = {
  code: 's = 0\nfor i in range(6_000_000):\n    s += i * i\nprint(s % 7)',
  timeoutMs: 20_000,
};

/** A long honest call alone, then beside innocent workers: what demotion costs it under load. */
async function longCall(pool: SandboxPool) {
  const alone: number[] = [];
  for (let i = 0; i < 3; i++) alone.push((await pool.run(LONG)).wallMs);
  let stop = false;
  let n = 0;
  const loops = Array.from({ length: innocentN }, async () => {
    for (; !stop; n++) await pool.run(INNOCENT);
  });
  const beside: number[] = [];
  for (let i = 0; i < 3; i++) beside.push((await pool.run(LONG)).wallMs);
  stop = true;
  await Promise.all(loops);
  const ms = (xs: number[]) => xs.map((x) => x.toFixed(0)).join(', ');
  console.log(
    `# long call, ${pool.options.slots} slots, demote after ${demoteAfterMs} ms, host CPU ${cpus()[0]?.model ?? '?'} x ${cpus().length}\n` +
      `alone ${ms(alone)} ms; beside ${innocentN} workers sending trivial calls ${ms(beside)} ms (${n} trivial calls meanwhile)`,
  );
}

const pct = (xs: number[], q: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))] ?? Number.NaN;
};

const demoteAfterMs = Number(values['demote-after-ms']);
if (!(Number.isInteger(demoteAfterMs) && demoteAfterMs >= 0))
  throw new Error('--demote-after-ms must be an integer >= 0');
/** Idle latency, then innocent calls beside hostile ones for --seconds. */
async function abuse(pool: SandboxPool) {
  // two baselines: one caller alone, and the same innocent load without attacks (with 2 workers on 2 cores the
  // innocent calls already wait for each other, which is not harm done by a hostile one)
  const idleRun = async (workers: number) => {
    const xs: number[] = [];
    await Promise.all(
      Array.from({ length: workers }, async () => {
        for (let i = 0; i < 2000; i++) {
          const t0 = performance.now();
          await pool.run(INNOCENT);
          xs.push(performance.now() - t0);
        }
      }),
    );
    return xs;
  };
  // taken before and after the attacks (once their wipes are done) and pooled, as the fork floor is: this host
  // drifts within a minute
  const idle = await idleRun(1);
  const same = innocentN > 1 ? await idleRun(innocentN) : idle;
  const end = Date.now() + seconds * 1000;
  const outcomes: Record<string, Record<string, number>> = {};
  const sample: Record<string, string> = {}; // the first error text per attack
  const lat: number[] = [];
  const inSlot: number[] = []; // the pool's wallMs: from the call's start in a slot to its answer
  let ok = 0;
  let failed = 0;
  // what the hostile workers ran while an innocent call failed: which attack it was harmed by
  const inFlight = new Map<number, { name: string; since: number }>();
  const recent: { name: string; since: number; until: number }[] = [];
  const failures: string[] = [];
  const names = values.attacks ? values.attacks.split(',') : Object.keys(ATTACKS);
  for (const n of names)
    if (!ATTACKS[n]) throw new Error(`--attacks: no attack '${n}' (${Object.keys(ATTACKS).join(', ')})`);
  // one loop per hostile worker, so the autogroup written is that loop's alone
  const hogs = values['host-loop'] ? busyLoops(hostileN, 19) : [];
  await Promise.all([
    ...Array.from({ length: hogs.length ? 0 : hostileN }, async (_, w) => {
      for (let i = w; Date.now() < end; i++) {
        const name = names[i % names.length];
        const req = ATTACKS[name];
        // a session attack gets a session of its own, which the worker holds for a second (its process spinning on
        // where it is not stopped) and then closes
        const session = req.session && `${req.session}-${w}-${i}`;
        const since = performance.now();
        inFlight.set(w, { name, since });
        const r = await pool.run(session ? { ...req, session } : req);
        inFlight.delete(w);
        recent.push({ name, since, until: performance.now() });
        if (session) {
          await new Promise((res) => setTimeout(res, 1000));
          pool.closeSession(session);
        }
        outcomes[name] ??= {};
        outcomes[name][r.status] = (outcomes[name][r.status] ?? 0) + 1;
        sample[name] ??= (r.error ?? r.stderr.trim().split('\n').pop() ?? '').slice(0, 100);
      }
    }),
    ...Array.from({ length: innocentN }, async () => {
      while (Date.now() < end) {
        const t0 = performance.now();
        const r = await pool.run(INNOCENT);
        lat.push(performance.now() - t0);
        inSlot.push(r.wallMs);
        if (r.status === 'ok' && r.stdout === '42\n') ok++;
        else {
          failed++;
          const beside = recent.filter((a) => a.until > t0).map((a) => a.name);
          for (const a of inFlight.values()) beside.push(`${a.name} (running)`);
          failures.push(
            `${r.status} after ${r.wallMs.toFixed(0)} ms in a slot (${(performance.now() - t0).toFixed(0)} ms in all), cpu ${r.cpuMs.toFixed(2)} ms, ` +
              `${r.error ?? r.stderr.trim().split('\n').pop() ?? ''}; attacks meanwhile: ${beside.join(', ')}`,
          );
        }
      }
    }),
  ]);
  for (const h of hogs) h.kill('SIGKILL');
  await new Promise((r) => setTimeout(r, 2000));
  idle.push(...(await idleRun(1)));
  if (innocentN > 1) same.push(...(await idleRun(innocentN)));
  const idleP99 = pct(idle, 0.99);
  const sameP99 = pct(same, 0.99);
  const p99 = pct(lat, 0.99);
  console.log(
    `# sandbox abuse: ${seconds} s, ${pool.options.slots} slots, ${hogs.length ? `${hostileN} lowest-priority busy loops outside the sandbox` : `${hostileN} hostile`} + ${innocentN} innocent workers, demote after ${demoteAfterMs} ms, ` +
      `${hostBusy ? `${hostBusy} busy loops outside the sandbox at nice 0, ` : ''}` +
      `host CPU ${cpus()[0]?.model ?? '?'} x ${cpus().length}`,
  );
  console.log(
    `idle trivial call, one caller: p50 ${pct(idle, 0.5).toFixed(1)} ms, p99 ${idleP99.toFixed(1)} ms`,
  );
  if (innocentN > 1)
    console.log(
      `the same ${innocentN} innocent workers without attacks: p50 ${pct(same, 0.5).toFixed(1)} ms, p99 ${sameP99.toFixed(1)} ms`,
    );
  console.log(
    `innocent calls: ${ok} ok, ${failed} failed (${((100 * ok) / Math.max(1, ok + failed)).toFixed(2)} %), ` +
      `p50 ${pct(lat, 0.5).toFixed(1)} ms, p99 ${p99.toFixed(1)} ms (${(p99 / idleP99).toFixed(1)}x one caller's idle p99` +
      `${innocentN > 1 ? `, ${(p99 / sameP99).toFixed(1)}x the same load's` : ''}); ` +
      `in a slot p50 ${pct(inSlot, 0.5).toFixed(1)} ms, p99 ${pct(inSlot, 0.99).toFixed(1)} ms`,
  );
  for (const f of failures) console.log(`failed innocent call: ${f}`);
  console.log(
    `sandbox restarts: ${pool.stats().restarts}${restarts.length ? ` (${restarts.join('; ')})` : ''}`,
  );
  if (hogs.length) return;
  console.log('\n| attack | outcomes | first message |\n|---|---|---|');
  for (const name of names)
    console.log(
      `| ${name} | ${Object.entries(outcomes[name] ?? {})
        .map(([s, n]) => `${s} ${n}`)
        .join(', ')} | ${sample[name] ?? ''} |`,
    );
}

/** n busy loops outside the sandbox at this nice, each a session of its own (with autogroups, a scheduling group
 * of that nice too); a session is out of reach of the terminal's ^C, so each also ends once this process is gone */
function busyLoops(n: number, nice: number) {
  const loop =
    `echo ${nice} > /proc/self/autogroup 2>/dev/null; exec nice -n ${nice} sh -c ` +
    `'i=0; while :; do i=$((i+1)); if [ $i -ge 100000 ]; then kill -0 ${process.pid} || exit; i=0; fi; done'`;
  const loops = Array.from({ length: n }, () =>
    spawn('sh', ['-c', loop], { detached: true, stdio: 'ignore' }),
  );
  process.once('exit', () => {
    for (const l of loops) l.kill('SIGKILL');
  });
  for (const l of loops) l.unref(); // the run ends when its work does, and takes them with it
  return loops;
}

busyLoops(hostBusy, 0);
// why the sandbox restarted, if it did
const restarts: string[] = [];
const pool = await SandboxPool.start({
  slots,
  timeoutMs: 2000,
  demoteAfterMs,
  log: (l) => /killing|exited/.test(l) && restarts.push(l),
});
try {
  for (let i = 0; i < 20; i++) await pool.run(INNOCENT); // warm up
  await (values['long-call'] ? longCall(pool) : abuse(pool));
} finally {
  await pool.close();
}
