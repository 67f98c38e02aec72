// How the sandbox broker is launched: the bubblewrap command line, the seccomp filter, and what the
// host supports. Everything a layer cannot do here is returned as a note so the pool can log it.
import { spawnSync } from 'node:child_process';
import {
  chmodSync,
  existsSync,
  mkdtempSync,
  openSync,
  readFileSync,
  readlinkSync,
  realpathSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { PYTHON_DIR } from '../util/python.js';
import { slotCgroups } from './cgroups.js';

/** bwrap: namespaces (bubblewrap) + per-slot uids + Landlock + seccomp; landlock: the same without namespaces, for
 * containers that refuse them (see planLaunch); none: no isolation, development only. */
export type IsolationMode = 'bwrap' | 'landlock' | 'none';

export const SANDBOX_PY_DIR = join(PYTHON_DIR, 'sandbox');
const INNER_PY_DIR = '/opt/rstar2-sandbox';
const DIST_PACKAGES = ['/usr/lib/python3/dist-packages'];
// What a snippet may read under Landlock; everything else (project, /home, /etc/shadow) is invisible.
const READ_PATHS = [
  '/usr',
  '/bin',
  '/lib',
  '/lib64',
  '/proc',
  '/sys/devices/system/cpu',
  '/etc/ld.so.cache',
  '/etc/alternatives',
  '/etc/localtime',
];

export interface LaunchPlan {
  command: string;
  args: string[];
  /** extra fds for spawn's stdio array, starting at fd 3 */
  extraFds: number[];
  /** written to the broker's stdin before anything else: its config */
  input: Buffer;
  /** config fields the Python broker (broker.py) needs (scratch, uid base, paths) */
  brokerConfig: Record<string, unknown>;
  /** how the calls' memory and process limits are held: 'cgroup v1', 'cgroup v2' (by the kernel), or 'polling' */
  limits: string;
  notes: string[];
  cleanup(): void;
}

export interface LaunchInput {
  isolation: IsolationMode;
  python: string;
  slots: number;
  scratchMb: number;
  shmMb: number;
  uidBase?: number;
  /** limits and preloads passed through to broker.py */
  config: Record<string, unknown>;
}

export function findBwrap(): string | null {
  for (const p of ['/usr/bin/bwrap', '/usr/local/bin/bwrap', '/bin/bwrap']) if (existsSync(p)) return p;
  return null;
}

const seccompCache = new Map<boolean, { path: string | null; note: string }>();

/** Compile the seccomp deny-list once per process and variant (the BPF is architecture-specific, never committed);
 * `landlock` adds the rules for a sandbox in the host's network and pid namespaces (seccomp_filter.py). */
export function seccompFilter(python: string, landlock = false): { path: string | null; note: string } {
  const cached = seccompCache.get(landlock);
  if (cached && (cached.path === null || existsSync(cached.path))) return cached;
  const dir = mkdtempSync(join(tmpdir(), 'rstar2-seccomp-'));
  const path = join(dir, 'filter.bpf');
  const script = join(SANDBOX_PY_DIR, 'seccomp_filter.py');
  const r = spawnSync(python, ['-I', script, path, ...(landlock ? ['--landlock'] : [])], {
    encoding: 'utf8',
  });
  let made: { path: string | null; note: string };
  if (r.status === 0 && existsSync(path)) made = { path, note: '' };
  else {
    rmSync(dir, { recursive: true, force: true });
    const why = (r.stderr || r.error?.message || `exit ${r.status}`).trim();
    made = { path: null, note: `seccomp filter unavailable, running without it: ${why}` };
  }
  seccompCache.set(landlock, made);
  return made;
}

function isRoot(): boolean {
  return typeof process.getuid === 'function' && process.getuid() === 0;
}

/** Whether this process holds CAP_SYS_NICE (bit 23), which Docker's default set leaves out: bwrap cannot
 * pass on a capability it does not have. */
function holdsSysNice(): boolean {
  try {
    const m = /^CapEff:\s*([0-9a-f]+)$/m.exec(readFileSync('/proc/self/status', 'utf8'));
    return m !== null && ((BigInt(`0x${m[1]}`) >> 23n) & 1n) === 1n;
  } catch {
    return false;
  }
}

/** The lowest pids.max (the process limit a container or systemd unit sets) over this process's cgroup and its
 * ancestors, from cgroup v1's pids hierarchy or v2; undefined where none is set or none can be read. */
export function pidsLimit(): number | undefined {
  let cgroups: string;
  try {
    cgroups = readFileSync('/proc/self/cgroup', 'utf8');
  } catch {
    return undefined;
  }
  const v1 = /^\d+:(?:[^:]*,)?pids(?:,[^:]*)?:(.*)$/m.exec(cgroups);
  const v2 = /^0::(.*)$/m.exec(cgroups);
  const [base, path] = v1 ? ['/sys/fs/cgroup/pids', v1[1]] : v2 ? ['/sys/fs/cgroup', v2[1]] : ['', ''];
  if (!base) return undefined;
  let min: number | undefined;
  for (let p = path; ; p = dirname(p)) {
    try {
      const v = readFileSync(join(base, p, 'pids.max'), 'utf8').trim();
      if (v !== 'max') min = Math.min(min ?? Number.POSITIVE_INFINITY, Number(v));
    } catch {} // the root has no pids.max
    if (p === dirname(p)) return min;
  }
}

/** OOM kills since boot (/proc/vmstat `oom_kill`, Linux >= 4.13: the host's and every cgroup's); undefined if
 * unknown. */
export function oomKillCount(): number | undefined {
  try {
    const m = /^oom_kill (\d+)$/m.exec(readFileSync('/proc/vmstat', 'utf8'));
    return m ? Number(m[1]) : undefined;
  } catch {
    return undefined;
  }
}

/** This process's hard limit on open files (`ulimit -Hn`), which the sandbox inherits; undefined if unknown. */
export function openFilesHardLimit(): number | undefined {
  try {
    const m = /^Max open files\s+\S+\s+(\d+)/m.exec(readFileSync('/proc/self/limits', 'utf8'));
    return m ? Number(m[1]) : undefined; // "unlimited" cannot be: the kernel caps it at fs.nr_open
  } catch {
    return undefined;
  }
}

/** Bind the host's merged-/usr symlinks (/bin -> usr/bin, ...) as the same symlinks. */
function rootLinks(): string[] {
  const out: string[] = [];
  for (const p of ['/bin', '/lib', '/lib64', '/sbin']) {
    try {
      out.push('--symlink', readlinkSync(p), p);
    } catch {
      if (existsSync(p)) out.push('--ro-bind', p, p);
    }
  }
  return out;
}

let launches = 0;
/** A uid range per sandbox launch, so pools on one host never share slot uids: RLIMIT_NPROC counts
 * per uid system-wide, and with isolation none the kill(-1) sweep would reach another pool's uid. In a user
 * namespace that maps only some uids (rootless Podman, Docker's userns-remap, Kubernetes' hostUsers: false: 65,536
 * as a rule) the range is taken inside the mapped uids and gids, between 30,000 and 60,000, above the accounts a
 * system makes and below nobody. */
function defaultUidBase(slots: number): number {
  launches++;
  const width = Math.ceil(slots / 1000) * 1000;
  const k = process.pid * 131 + launches;
  const maps = ['uid_map', 'gid_map'].map(idMap);
  if (maps.every((m) => m.some(([start, count]) => start === 0 && count >= 2 ** 32 - 1)))
    return 100_000 + (k % 50_000) * width;
  const bases: number[] = [];
  for (let b = 30_000; b + width <= 60_000; b += width) {
    if (maps.every((m) => m.some(([start, count]) => start <= b && b + width <= start + count)))
      bases.push(b);
  }
  if (!bases.length) {
    throw new Error(
      `no ${width} uids between 30000 and 60000 are mapped in this user namespace for the sandbox's slots ` +
        `(/proc/self/uid_map: ${JSON.stringify(maps[0])}); pass uidBase where uids and gids are mapped`,
    );
  }
  return bases[k % bases.length];
}

/** This process's user namespace id map: [first id inside, count] per line. */
function idMap(file: string): [number, number][] {
  try {
    return readFileSync(`/proc/self/${file}`, 'utf8')
      .trim()
      .split('\n')
      .map((l) => l.trim().split(/\s+/).map(Number))
      .map(([inside, , count]) => [inside, count] as [number, number]);
  } catch {
    return [[0, 2 ** 32 - 1]]; // no /proc: assume every id exists, as before
  }
}

export function planLaunch(inp: LaunchInput): LaunchPlan {
  const notes: string[] = [];
  const root = isRoot();
  const uidBase = root ? (inp.uidBase ?? defaultUidBase(inp.slots)) : 0;
  if (!root)
    notes.push('not running as root: no per-slot uids, so leftover processes are swept by session only');
  const renice = root && holdsSysNice();
  if (root && !renice && inp.config.demoteAfterMs)
    notes.push('no CAP_SYS_NICE: calls that run long keep their priority (demoteAfterMs off)');
  const demote = renice ? {} : { demoteAfterMs: 0 };
  // the slots' cgroups come first among the extra fds: fd 3 (and 4) in the sandbox
  const cg = slotCgroups(inp.slots);
  const cgroups = 'fds' in cg ? cg : undefined;
  const limits = cgroups?.mode ?? 'polling';
  if ('why' in cg) notes.push(`no cgroup per slot: ${cg.why}`);
  const cgroupConfig = cgroups
    ? { cgroup: { ...cgroups.config, fds: cgroups.fds.map((_, i) => 3 + i) } }
    : {};
  const cleanupCgroups = () => cgroups?.cleanup();
  // The config goes in on stdin, ahead of the first frame, not in argv: /proc/PID/cmdline is readable by
  // every process in the sandbox, snippets included.
  const brokerArgs = (script: string) => ['-I', '-S', script];
  const configFrame = (cfg: Record<string, unknown>) => {
    const json = Buffer.from(JSON.stringify({ ...inp.config, ...cfg }));
    const len = Buffer.alloc(4);
    len.writeUInt32LE(json.length);
    return Buffer.concat([len, json]);
  };

  if (inp.isolation === 'landlock' && !root) {
    throw new Error(
      'isolation landlock needs root: without namespaces, only a uid of its own per slot keeps a snippet from ' +
        "signalling or reading this user's other processes",
    );
  }
  if (inp.isolation === 'none' || inp.isolation === 'landlock') {
    const scratch = mkdtempSync(join(tmpdir(), 'rstar2-sandbox-'));
    chmodSync(scratch, 0o711); // each slot's uid passes through to its own dir (0700), and lists nothing here
    let brokerConfig: Record<string, unknown>;
    if (inp.isolation === 'none') {
      notes.push(
        'isolation none: no namespaces, no seccomp, host filesystem visible except where Landlock applies',
      );
      brokerConfig = { readPaths: [...READ_PATHS, scratch], shmDir: root ? '/dev/shm' : '' };
    } else {
      // Without namespaces: the host's /proc, /dev and /dev/shm are the ones every process shares, so a snippet
      // gets none of /proc, only the harmless devices, no /dev/shm, and the scratch on the host's disk is bounded
      // by the broker (flat, counted) rather than by a tmpfs of its own
      const sec = seccompFilter(inp.python, true);
      if (!sec.path) {
        cleanupCgroups();
        throw new Error(`isolation landlock needs the seccomp filter: ${sec.note}`);
      }
      notes.push(
        'isolation landlock: no namespaces; per-slot uids, Landlock, seccomp; snippets see no /proc or /dev/shm, ' +
          'and their scratch is on the host disk, bounded by the broker',
      );
      brokerConfig = {
        readPaths: READ_PATHS.filter((p) => p !== '/proc'),
        devPaths: ['/dev/null', '/dev/zero', '/dev/full', '/dev/random', '/dev/urandom'],
        shmDir: '',
        seccompPath: sec.path,
        requireLandlock: true,
        scratchMb: inp.scratchMb,
      };
    }
    brokerConfig = { ...brokerConfig, scratch, uidBase, sysPath: DIST_PACKAGES, ...demote, ...cgroupConfig };
    const broker = [inp.python, ...brokerArgs(join(SANDBOX_PY_DIR, 'broker.py'))];
    // landlock: the environment bwrap's --clearenv leaves, not this process's (tokens, keys) for every snippet
    const clean = inp.isolation === 'landlock' ? ['-i', 'PATH=/usr/bin:/bin', 'LANG=C.UTF-8'] : [];
    return {
      command: clean.length ? '/usr/bin/env' : broker[0],
      args: clean.length ? [...clean, ...broker] : broker.slice(1),
      input: configFrame(brokerConfig),
      extraFds: [...(cgroups?.fds ?? [])],
      brokerConfig,
      limits,
      notes,
      cleanup: () => {
        rmSync(scratch, { recursive: true, force: true });
        cleanupCgroups();
      },
    };
  }

  const bwrap = findBwrap();
  const py = bwrap ? realpathSync(inp.python) : '';
  if (!bwrap || !py.startsWith('/usr/')) cleanupCgroups();
  if (!bwrap) throw new Error('bubblewrap (bwrap) not found: apt-get install bubblewrap');
  if (!py.startsWith('/usr/')) {
    throw new Error(
      `the sandbox mounts only /usr; python ${inp.python} resolves to ${py} (use /usr/bin/python3)`,
    );
  }
  const sec = seccompFilter(inp.python);
  if (sec.note) notes.push(sec.note);
  const args = [
    '--die-with-parent',
    '--new-session',
    '--unshare-net',
    '--unshare-pid',
    '--unshare-ipc',
    '--unshare-uts',
    '--unshare-cgroup-try',
    '--ro-bind',
    '/usr',
    '/usr',
    ...rootLinks(),
    '--perms',
    '0755',
    '--dir',
    '/etc',
    '--ro-bind-try',
    '/etc/ld.so.cache',
    '/etc/ld.so.cache',
    '--ro-bind-try',
    '/etc/alternatives',
    '/etc/alternatives',
    '--ro-bind-try',
    '/etc/localtime',
    '/etc/localtime',
    '--ro-bind-try',
    '/sys/devices/system/cpu',
    '/sys/devices/system/cpu',
    '--proc',
    '/proc',
    '--dev',
    '/dev',
    '--perms',
    '1777',
    '--size',
    String(inp.shmMb * inp.slots * 1048576),
    '--tmpfs',
    '/dev/shm',
    '--remount-ro',
    '/dev',
    '--perms',
    '0755',
    '--dir',
    '/scratch',
  ];
  for (let s = 0; s < inp.slots; s++) {
    args.push('--perms', '0700', '--size', String(inp.scratchMb << 20), '--tmpfs', `/scratch/${s}`);
  }
  args.push('--clearenv', '--setenv', 'PATH', '/usr/bin:/bin', '--setenv', 'LANG', 'C.UTF-8');
  if (root) {
    // No user namespace as root: it would map only uid 0 and per-slot uids would be impossible. SYS_NICE lets
    // the broker lower the priority of a slot uid's processes; a child's setresuid drops it with the rest.
    args.push('--cap-drop', 'ALL');
    for (const c of [
      'CHOWN',
      'DAC_OVERRIDE',
      'FOWNER',
      'KILL',
      'SETGID',
      'SETUID',
      ...(renice ? ['SYS_NICE'] : []),
      // only for the broker's first steps: it remounts /proc with hidepid, then drops it (broker.py, hide_pids)
      'SYS_ADMIN',
    ])
      args.push('--cap-add', `CAP_${c}`);
  } else {
    args.push('--unshare-user');
  }
  const extraFds: number[] = [...(cgroups?.fds ?? [])];
  // The broker's two files are copied in, not bound: a bind mount shows its host path (the checkout's) in every
  // process's /proc/self/mountinfo (issue 42). The seccomp program too: the broker loads it itself (not bwrap's
  // --seccomp), once it has made what the filter refuses: its sock_diag socket and, as root, /proc's hidepid.
  const files: [string, string][] = [
    [join(SANDBOX_PY_DIR, 'broker.py'), 'broker.py'],
    [join(SANDBOX_PY_DIR, 'zygote.py'), 'zygote.py'],
    ...(sec.path ? [[sec.path, 'seccomp.bpf'] as [string, string]] : []),
  ];
  for (const [from, to] of files) {
    extraFds.push(openSync(from, 'r'));
    args.push('--perms', '0444', '--file', String(2 + extraFds.length), `${INNER_PY_DIR}/${to}`);
  }
  const brokerConfig = {
    scratch: '/scratch',
    pidNamespace: true,
    // issue 42, break 5: a call sees no process of another slot's uid in /proc (the broker and zygote, gid 0, see all)
    hidePids: root,
    ...(sec.path ? { brokerSeccompPath: `${INNER_PY_DIR}/seccomp.bpf` } : {}),
    uidBase,
    readPaths: READ_PATHS,
    shmDir: '/dev/shm',
    sysPath: DIST_PACKAGES,
    ...demote,
    ...cgroupConfig,
  };
  // bwrap stays in the sandbox as its pid 1, so its argv (host paths) would be readable there: it reads its
  // options from an unlinked file instead (--args FD). The command itself names only paths inside.
  const argsDir = mkdtempSync(join(tmpdir(), 'rstar2-bwrap-'));
  const argsFile = join(argsDir, 'args');
  writeFileSync(argsFile, args.map((a) => `${a}\0`).join(''), { mode: 0o600 });
  const argsFd = openSync(argsFile, 'r');
  rmSync(argsDir, { recursive: true, force: true });
  extraFds.push(argsFd);
  return {
    command: bwrap,
    args: ['--args', String(2 + extraFds.length), py, ...brokerArgs(`${INNER_PY_DIR}/broker.py`)],
    input: configFrame(brokerConfig),
    extraFds,
    brokerConfig,
    limits,
    notes,
    cleanup: cleanupCgroups,
  };
}
