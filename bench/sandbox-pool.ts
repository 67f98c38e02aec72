// Throughput and latency of the embedded sandbox pool (full isolation unless --isolation none).
// Usage: flock /tmp/bench.lock npx tsx bench/sandbox-pool.ts [--n 3000] [--concurrency 64] [--slots N]
//          [--shards N]
// Prints calls/s, p50/p99 latency and CPU ms per call (Node + every process in the sandbox trees) for:
// idle sequential calls, trivial calls at concurrency C, stateful-session calls (--only session), a stdlib
// math snippet (--only math), numpy preloaded, 0.5 s busy loops, the fork floor of this machine and what a page
// costs a new process (--only floor), and calls without pre-forked spares (--only no-prefork).
// --only scale: how throughput grows with cores and shards, one table: the whole process (and so the sandbox)
// pinned to 1, 2, 4, ... cores (--cores LIST) with the default shard count for that many, then on every core
// each shard count from 1 to the default (--shards LIST to choose); calls/s and the sandbox's CPU per call
// against the fork floor taken on the same cores.
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { availableParallelism, release } from 'node:os';
import { defaultShards, ShardedPool, type ShardedPoolOptions } from '../src/sandbox/shards.js';
import type { RunRequest } from '../src/sandbox/types.js';
import { findPython } from '../src/util/python.js';

import { benchArgs } from './args.js';

const { values } = benchArgs(import.meta.url, {
  options: {
    n: { type: 'string', default: '3000' },
    concurrency: { type: 'string', default: '64' },
    slots: { type: 'string' },
    isolation: { type: 'string', default: 'bwrap' },
    only: { type: 'string' },
    shards: { type: 'string' },
    cores: { type: 'string' },
  },
});
const N = Number(values.n);
const C = Number(values.concurrency);
const TICK_MS = 10; // USER_HZ is 100 on Linux

interface ProcCpu {
  pid: number;
  comm: string;
  cmdline: string;
  self: number; // ms of its own CPU
  reaped: number; // ms of CPU of the children it waited for
  faults: number; // its own minor page faults
  reapedFaults: number; // minor page faults of the children it waited for
}

// The sandbox's process tree in depth-first order (bwrap, its pid-namespace init, broker, zygote, live
// children), each with its own CPU and the CPU of the children it reaped.
function treeCpu(root: number): ProcCpu[] {
  const out: ProcCpu[] = [];
  const stack = [root];
  while (stack.length) {
    const pid = stack.pop() as number;
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
      const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      const comm = stat.slice(stat.indexOf('(') + 1, stat.lastIndexOf(')'));
      const cmdline = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
      out.push({
        pid,
        comm,
        cmdline,
        self: (Number(f[11]) + Number(f[12])) * TICK_MS, // utime stime
        reaped: (Number(f[13]) + Number(f[14])) * TICK_MS, // cutime cstime
        faults: Number(f[7]), // minflt
        reapedFaults: Number(f[8]), // cminflt
      });
      for (const c of readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').split(' ').reverse())
        if (c) stack.push(Number(c));
    } catch {
      // exited between reads
    }
  }
  return out;
}

function treeCpuMs(roots: number[]): number {
  return roots.flatMap(treeCpu).reduce((a, p) => a + p.self + p.reaped, 0);
}

type Split = Record<'broker' | 'zygote' | 'children', { ms: number; faults: number }>;

// The broker is the first python process of the tree; the zygote is the one started as a fresh interpreter
// (`-c`; the wiper is a fork of the broker and shares its command line). The per-call children are reaped by
// the zygote, so their CPU and page faults are the zygote's reaped ones.
function sandboxSplit(root: number): Split {
  const py = treeCpu(root).filter((p) => p.comm.startsWith('python'));
  const b = py[0];
  const z = py.find((p) => p !== b && p.cmdline !== b?.cmdline);
  return {
    broker: { ms: b?.self ?? 0, faults: b?.faults ?? 0 },
    zygote: { ms: z?.self ?? 0, faults: z?.faults ?? 0 },
    children: { ms: z?.reaped ?? 0, faults: z?.reapedFaults ?? 0 },
  };
}

/** The split over every shard's sandbox, added up. */
function shardsSplit(roots: number[]): Split {
  const out: Split = {
    broker: { ms: 0, faults: 0 },
    zygote: { ms: 0, faults: 0 },
    children: { ms: 0, faults: 0 },
  };
  for (const s of roots.map(sandboxSplit))
    for (const k of ['broker', 'zygote', 'children'] as const) {
      out[k].ms += s[k].ms;
      out[k].faults += s[k].faults;
    }
  return out;
}

function otherLoadCores(a: number[], b: number[]): number {
  const busy = (x: number[]) => x.reduce((s, v) => s + v, 0) - x[3] - x[4];
  const total = (x: number[]) => x.reduce((s, v) => s + v, 0);
  return (busy(b) - busy(a)) / ((total(b) - total(a)) / 2);
}
function procStat(): number[] {
  return readFileSync('/proc/stat', 'utf8').split('\n')[0].split(/\s+/).slice(1).map(Number);
}

async function measure(pool: ShardedPool, name: string, req: RunRequest, n: number, conc: number) {
  const floorBefore = forkFloor(['+_exit'], ['os.fork'], 1000);
  const lat: number[] = [];
  let next = 0;
  let failed = 0;
  const pid = pool.sandboxPids;
  const cpu0 = treeCpuMs(pid);
  const split0 = shardsSplit(pid);
  const node0 = process.cpuUsage();
  const st0 = procStat();
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: conc }, async () => {
      while (next < n) {
        next++;
        const s = performance.now();
        const r = await pool.run(req);
        lat.push(performance.now() - s);
        if (r.status !== 'ok') failed++;
      }
    }),
  );
  const wall = performance.now() - t0;
  const nodeCpu = process.cpuUsage(node0);
  const sandboxCpu = treeCpuMs(pid) - cpu0;
  const split1 = shardsSplit(pid);
  const per = (k: keyof Split) => ((split1[k].ms - split0[k].ms) / n).toFixed(2);
  const faults = (k: keyof Split) => ((split1[k].faults - split0[k].faults) / n).toFixed(0);
  const cores = otherLoadCores(st0, procStat());
  lat.sort((a, b) => a - b);
  const q = (p: number) => lat[Math.min(lat.length - 1, Math.floor(p * lat.length))].toFixed(2);
  const nodeMs = (nodeCpu.user + nodeCpu.system) / 1000;
  // the host drifts between phases within seconds: the floor is taken just before and just after
  const floorMs = (floorMsOf(floorBefore) + floorMsOf(forkFloor(['+_exit'], ['os.fork'], 1000))) / 2;
  console.log(
    `${name.padEnd(28)} n=${n} c=${conc} shards=${pid.length} calls/s=${((n / wall) * 1000).toFixed(0)} p50=${q(0.5)}ms ` +
      `p99=${q(0.99)}ms cpu/call=${((nodeMs + sandboxCpu) / n).toFixed(2)}ms ` +
      `= ${((nodeMs + sandboxCpu) / n / floorMs).toFixed(2)}x fork floor ${floorMs.toFixed(2)}, the sandbox alone ${(sandboxCpu / n / floorMs).toFixed(2)}x ` +
      `(node ${(nodeMs / n).toFixed(2)}, sandbox ${(sandboxCpu / n).toFixed(2)}: broker ${per('broker')} ` +
      `zygote ${per('zygote')} children ${per('children')}) page faults/call: broker ${faults('broker')} ` +
      `zygote ${faults('zygote')} child ${faults('children')} failed=${failed} machine-busy=${cores.toFixed(2)} cores`,
  );
  return { callsPerS: (n / wall) * 1000, sandboxMs: sandboxCpu / n, floorMs };
}

async function measureSessions(pool: ShardedPool, name: string, n: number, conc: number) {
  // worker k always uses session k, so calls of one session never queue behind each other
  const lat: number[] = [];
  let started = 0;
  let failed = 0;
  const pid = pool.sandboxPids;
  const cpu0 = treeCpuMs(pid);
  const node0 = process.cpuUsage();
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: conc }, async (_, k) => {
      while (started < n) {
        started++;
        const s = performance.now();
        const res = await pool.run({ code: 'print(1+1)', session: `bench-${k}` });
        lat.push(performance.now() - s);
        if (res.status !== 'ok') failed++;
      }
    }),
  );
  const wall = performance.now() - t0;
  const nodeCpu = process.cpuUsage(node0);
  const nodeMs = (nodeCpu.user + nodeCpu.system) / 1000;
  const sandboxCpu = treeCpuMs(pid) - cpu0;
  lat.sort((a, b) => a - b);
  const q = (p: number) => lat[Math.min(lat.length - 1, Math.floor(p * lat.length))].toFixed(2);
  console.log(
    `${name.padEnd(28)} n=${n} c=${conc} calls/s=${((n / wall) * 1000).toFixed(0)} p50=${q(0.5)}ms ` +
      `p99=${q(0.99)}ms cpu/call=${((nodeMs + sandboxCpu) / n).toFixed(2)}ms failed=${failed}`,
  );
}

async function withPool(opts: ShardedPoolOptions, fn: (p: ShardedPool) => Promise<void>) {
  const shards = values.shards && !values.shards.includes(',') ? Number(values.shards) : undefined;
  const pool = await ShardedPool.start({
    isolation: values.isolation as 'bwrap' | 'none',
    ...(values.slots ? { slots: Number(values.slots) } : {}),
    ...(shards ? { shards } : {}),
    log: (l) => console.error(`  [sandbox] ${l}`),
    ...opts,
  });
  try {
    await pool.runBatch(Array.from({ length: 50 }, () => ({ code: 'print(1+1)' }))); // warm up
    await fn(pool);
  } finally {
    await pool.close();
  }
}

// What any fork-per-call executor pays on this machine before doing anything: a Python process with the
// zygote's own modules (not the stdlib set it preloads for snippets, ~1 MiB: within the drift here, and it
// leaves the floor if anything lower) forks children that exit at once (or run print(1+1) to /dev/null),
// with os.fork and with glibc's fork as the zygote calls it (no CPython after-fork work). CPU of parent and
// children per fork bounds calls/s at cores / that.
function forkFloor(variants: string[], forks: string[], n: number): string {
  const script = `
import _socket, ctypes, gc, json, os, resource, select, signal, struct, sys, types
code = compile("print(1+1)", "<s>", "exec")
null = os.open("/dev/null", os.O_WRONLY)
gc.collect(); gc.freeze(); gc.disable()
def cpu(who): r = resource.getrusage(who); return r.ru_utime + r.ru_stime
def flt(who): return resource.getrusage(who).ru_minflt
forks = {"os.fork": os.fork, "glibc fork": ctypes.CDLL(None).fork}
for fork_name in ${JSON.stringify(forks)}:
  fork = forks[fork_name]
  for name in ${JSON.stringify(variants)}:
    run, n = name != "+_exit", ${n}
    s0, c0 = cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN)
    f0, g0 = flt(resource.RUSAGE_SELF), flt(resource.RUSAGE_CHILDREN)
    for _ in range(n):
        pid = fork()
        if pid == 0:
            if run:
                os.dup2(null, 1)
                exec(code, types.ModuleType("__main__").__dict__)
                sys.stdout.flush()
            os._exit(0)
        os.waitpid(pid, 0)
    ms = ((cpu(resource.RUSAGE_SELF) - s0) + (cpu(resource.RUSAGE_CHILDREN) - c0)) / n * 1e3
    pf = (flt(resource.RUSAGE_SELF) - f0) / n, (flt(resource.RUSAGE_CHILDREN) - g0) / n
    print(f"{fork_name + name:28s} cpu/call={ms:.2f}ms (parent + child) -> at most {os.cpu_count() * 1000 / ms:.0f} calls/s on {os.cpu_count()} cores; page faults/call parent {pf[0]:.0f} child {pf[1]:.0f}")
`;
  return execFileSync(findPython(undefined, 'RSTAR2_SANDBOX_PYTHON'), ['-I', '-S', '-c', script], {
    encoding: 'utf8',
  });
}
// What a page costs a new process. Under a software MMU (a PVM guest shadows every process's page tables in the
// hypervisor) a fresh process's first touch of each page it inherited traps, so a call costs in proportion to
// the pages it touches and the fork floor, which touches few, understates it: on such a host the ratio to the
// floor cannot be compared with a host whose MMU is hardware-virtualised (where the first touch is ~free).
function pageCosts(): string {
  const script = `
import mmap, os, struct, time
N = 2048
m = mmap.mmap(-1, N * 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for i in range(0, N * 4096, 4096): m[i] = 1
def per_page(write):
    t = time.perf_counter()
    for i in range(0, N * 4096, 4096):
        if write: m[i] = 2
        else: m[i]
    return (time.perf_counter() - t) / N * 1e6
r, w = os.pipe()
runs = []
for _ in range(5):
    pid = os.fork()
    if pid == 0:
        os.write(w, struct.pack("3d", per_page(False), per_page(False), per_page(True)))
        os._exit(0)
    os.waitpid(pid, 0)
    runs.append(struct.unpack("3d", os.read(r, 24)))
first, warm, cow = (sorted(x)[2] for x in zip(*runs))
print(f"a page in a forked child: first read {first:.2f} us, read again {warm:.2f} us, first write (copy-on-write) {cow:.2f} us")
`;
  return execFileSync(findPython(undefined, 'RSTAR2_SANDBOX_PYTHON'), ['-I', '-S', '-c', script], {
    encoding: 'utf8',
  }).trimEnd();
}
const floorMsOf = (out: string) => Number(/os\.fork\+_exit\s+cpu\/call=([\d.]+)ms/.exec(out)?.[1]);

const trivial = { code: 'print(1+1)' };
const want = (k: string) => !values.only || values.only.split(',').includes(k);
const cpuModel = /model name\s*:\s*(.*)/.exec(readFileSync('/proc/cpuinfo', 'utf8'))?.[1] ?? 'unknown CPU';
console.log(
  `sandbox pool bench: isolation=${values.isolation} cores=${availableParallelism()} cpu="${cpuModel}" ` +
    `kernel=${release()}`,
);
// Every number is reported next to this host's fork floor (os.fork + _exit of a Python process with the
// zygote's imports, parent + child CPU): per-call cost only compares across hosts as a multiple of it.
console.log(
  `fork floor (no sandbox, no pipes, no isolation steps):\n${forkFloor(
    ['+_exit', '+print(1+1)+_exit'],
    ['os.fork', 'glibc fork'],
    values.only === 'floor' ? Math.min(N, 2000) : 1000,
  ).trimEnd()}\n${pageCosts()}`,
);
if (want('trivial')) {
  await withPool({}, async (pool) => {
    const info = pool.shards[0].info;
    console.log(
      `slots=${pool.slots} shards=${pool.shards.length} landlock=${info.landlock} uidBase=${info.uidBase}`,
    );
    await measure(pool, 'idle sequential print(1+1)', trivial, Math.min(N, 500), 1);
    await measure(pool, 'print(1+1)', trivial, N, C);
  });
}
if (want('no-prefork')) {
  // every call forks its child on arrival (the spares' effect on latency and CPU, same machine, same run)
  await withPool({ prefork: false }, async (pool) => {
    await measure(pool, 'no prefork: idle sequential', trivial, Math.min(N, 500), 1);
    await measure(pool, 'no prefork: print(1+1)', trivial, N, C);
  });
}
if (want('session')) {
  // stateful sessions: a warm interpreter per session id, no fork per call
  await withPool({ maxSessions: 16 }, async (pool) => {
    await measure(pool, 'session, idle sequential', { code: 'print(1+1)', session: 'bench-idle' }, 300, 1);
    pool.closeSession('bench-idle');
    await measureSessions(pool, 'session print(1+1)', N, Math.min(C, 16));
  });
}
if (want('math')) {
  // what a model's tool call looks like more often than print(1+1): stdlib imports the zygote holds already
  const math = {
    code:
      'from fractions import Fraction\nfrom itertools import combinations\nimport math\n' +
      'print(sum(1 for _ in combinations(range(12), 4)), Fraction(1, 3) + Fraction(1, 6), math.comb(30, 7))',
  };
  await withPool({}, async (pool) => {
    await measure(pool, 'math snippet, idle', math, Math.min(N, 300), 1);
    await measure(pool, 'math snippet', math, N, C);
  });
}
if (want('numpy')) {
  await withPool({ preload: ['numpy'] }, async (pool) => {
    await measure(
      pool,
      'numpy preloaded, idle',
      { code: 'import numpy as np\nprint(np.ones(3).sum())' },
      300,
      1,
    );
    await measure(pool, 'numpy preloaded', { code: 'import numpy as np\nprint(np.ones(3).sum())' }, N, C);
  });
}
if (want('busy')) {
  await withPool({}, async (pool) => {
    const busy = {
      code: 'import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5:\n    pass',
    };
    await measure(pool, '0.5 s busy loop', busy, 40, C);
  });
}

if (values.only?.split(',').includes('scale')) {
  // This process is pinned to the first k of its cores, and every sandbox it starts after inherits that.
  const allowed = cpuList(
    /Cpus_allowed_list:\s*(\S+)/.exec(readFileSync('/proc/self/status', 'utf8'))?.[1] ?? '0',
  );
  const pin = (k: number) =>
    execFileSync('taskset', ['-a', '-p', '-c', allowed.slice(0, k).join(','), String(process.pid)], {
      stdio: 'ignore',
    });
  const all = allowed.length;
  const coreCounts = values.cores
    ? values.cores.split(',').map(Number)
    : [...new Set([...[1, 2, 4, 8, 16, 32, 64].filter((k) => k < all), all])];
  const shardCounts = values.shards?.includes(',')
    ? values.shards.split(',').map(Number)
    : Array.from({ length: defaultShards(all) }, (_, i) => i + 1);
  const rows: string[] = [];
  const row = async (k: number, shards: number) => {
    pin(k);
    const slots = values.slots ? Number(values.slots) : 4 * k;
    await withPool({ shards, slots }, async (pool) => {
      // at most 1,000 calls per core, so one core's row takes seconds, not minutes
      const m = await measure(pool, `scale: ${k} cores, ${shards} shards`, trivial, Math.min(N, 1000 * k), C);
      rows.push(
        `${String(k).padStart(5)} ${String(shards).padStart(6)} ${String(slots).padStart(5)} ` +
          `${m.callsPerS.toFixed(0).padStart(7)} ${m.sandboxMs.toFixed(2).padStart(9)} ` +
          `${m.floorMs.toFixed(2).padStart(6)} ${(m.sandboxMs / m.floorMs).toFixed(2).padStart(7)}x`,
      );
    });
  };
  try {
    for (const k of coreCounts) await row(k, defaultShards(k));
    for (const n of shardCounts) if (n !== defaultShards(all) || !coreCounts.includes(all)) await row(all, n);
  } finally {
    pin(all);
  }
  console.log(
    `\nthroughput by cores and shards, print(1+1) at c=${C}, n=min(${N}, 1000 x cores) (shards: the default for that many cores, then ` +
      `each count on all ${all}):\ncores shards slots calls/s sandbox ms  floor  x floor\n${rows.join('\n')}`,
  );
}

/** "0-3,8,10-11" as [0, 1, 2, 3, 8, 10, 11]. */
function cpuList(s: string): number[] {
  return s.split(',').flatMap((part) => {
    const [a, b] = part.split('-').map(Number);
    return Array.from({ length: (b ?? a) - a + 1 }, (_, i) => a + i);
  });
}
