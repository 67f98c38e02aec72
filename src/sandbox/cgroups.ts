// Kernel-enforced limits for the sandbox's slots (issue 56 item 1): a memory and a pids cgroup per slot, made
// here (as root, before the sandbox starts) under this process's own groups, so a container's or unit's limits
// still hold above them. The broker and zygote get the groups as directory fds, open on fd 3 (and 4) of the
// sandbox: under bubblewrap no cgroup filesystem is mounted inside, and the fds name no host path. Each call's
// process moves itself into its slot's groups before it drops root; the groups' directory is root's, mode 0700, so
// no slot uid can open a file in them (nothing is delegated to sandboxed code). Where none can be made (not root,
// no memory or pids controller, a v2 hierarchy whose controllers this process cannot enable below itself), the
// broker's polling of /proc is the only memory bound, as before.
import {
  chmodSync,
  closeSync,
  existsSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  rmdirSync,
  writeFileSync,
} from 'node:fs';
import { join } from 'node:path';

/** What a pool's sandbox holds its limits with: the broker's config, the fds to pass, and how to remove them. */
export interface SlotCgroups {
  /** `cgroup v1` or `cgroup v2` */
  mode: string;
  /** directory fds to pass to the sandbox, in order, from fd 3 on: v1 memory and pids, or the one v2 group */
  fds: number[];
  config: { version: 1 | 2 };
  /** Removes the groups once their processes are gone; waits up to `waitMs` for those still exiting. */
  cleanup(waitMs?: number): void;
}

export const CGROUPS_ENV = 'RSTAR2_SANDBOX_CGROUPS';
const PREFIX = 'rstar2-sandbox-';
let made = 0;

function mounts(): { type: string; dir: string; opts: string[] }[] {
  return readFileSync('/proc/mounts', 'utf8')
    .split('\n')
    .map((l) => l.split(' '))
    .filter((f) => f.length >= 4)
    .map(([, dir, type, opts]) => ({ type, dir, opts: opts.split(',') }));
}

/** This process's path in the hierarchy holding `controller` (v1), or in the v2 one ('' for it). */
function ownPath(controller: string): string | undefined {
  for (const line of readFileSync('/proc/self/cgroup', 'utf8').split('\n')) {
    const [, names, path] = line.split(':');
    if (path === undefined) continue;
    if (names.split(',').includes(controller)) return path;
  }
  return undefined;
}

const sleep = (ms: number) => Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);

function removeTree(dir: string, waitMs: number): boolean {
  const until = Date.now() + waitMs;
  for (;;) {
    try {
      for (const e of readdirSync(dir, { withFileTypes: true }))
        if (e.isDirectory()) rmdirSync(join(dir, e.name));
      rmdirSync(dir);
      return true;
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code === 'ENOENT') return true;
      // EBUSY: a process of the group is still exiting (killed with the sandbox, it needs a moment of CPU)
      if (code !== 'EBUSY' || Date.now() >= until) return false;
      sleep(10);
    }
  }
}

// Groups a process that ended without its cleanup (killed) left under `parent`: empty by now, removed.
function removeStale(parent: string): void {
  let names: string[];
  try {
    names = readdirSync(parent).filter((n) => n.startsWith(PREFIX));
  } catch {
    return;
  }
  for (const n of names) {
    const pid = Number(n.slice(PREFIX.length).split('-')[0]);
    if (pid === process.pid || existsSync(`/proc/${pid}`)) continue;
    removeTree(join(parent, n), 0);
  }
}

function makeGroups(parent: string, slots: number, setup: (dir: string) => void): string {
  removeStale(parent);
  const dir = join(parent, `${PREFIX}${process.pid}-${++made}`);
  mkdirSync(dir);
  try {
    chmodSync(dir, 0o700);
    setup(dir);
    for (let s = 0; s < slots; s++) mkdirSync(join(dir, String(s)));
  } catch (e) {
    removeTree(dir, 0);
    throw e;
  }
  return dir;
}

/**
 * A memory and a pids group per slot where this host allows it, else why not (the pool says so at start).
 * RSTAR2_SANDBOX_CGROUPS=off turns it off (polling only).
 */
export function slotCgroups(slots: number): SlotCgroups | { why: string } {
  const env = process.env[CGROUPS_ENV];
  if (env !== undefined && env !== '' && env !== 'off' && env !== 'auto')
    throw new Error(`${CGROUPS_ENV} must be 'auto' or 'off', got '${env}'`);
  if (env === 'off') return { why: `${CGROUPS_ENV}=off` };
  if (typeof process.getuid !== 'function' || process.getuid() !== 0)
    return { why: 'not running as root: no cgroup of its own per slot' };
  let all: ReturnType<typeof mounts>;
  try {
    all = mounts();
  } catch (e) {
    return { why: `cannot read /proc/mounts (${(e as Error).message})` };
  }
  const v1 = (c: string) => all.find((m) => m.type === 'cgroup' && m.opts.includes(c))?.dir;
  const [memory, pids] = [v1('memory'), v1('pids')];
  const dirs: string[] = [];
  const fds: number[] = [];
  const fail = (e: unknown) => {
    for (const fd of fds) closeSync(fd);
    for (const d of dirs) removeTree(d, 0);
    return { why: (e as Error).message };
  };
  const result = (mode: string, version: 1 | 2): SlotCgroups => ({
    mode,
    fds,
    config: { version },
    cleanup: (waitMs = 2000) => {
      for (const d of dirs) removeTree(d, waitMs);
    },
  });
  if (memory && pids) {
    try {
      for (const [mount, c] of [
        [memory, 'memory'],
        [pids, 'pids'],
      ]) {
        const parent = join(mount, ownPath(c) ?? '/');
        dirs.push(makeGroups(parent, slots, () => {}));
        fds.push(openSync(dirs[dirs.length - 1], 'r'));
      }
      return result('cgroup v1', 1);
    } catch (e) {
      return fail(e);
    }
  }
  const unified = all.find((m) => m.type === 'cgroup2')?.dir;
  const own = ownPath('');
  if (!unified || own === undefined) return { why: 'no cgroup memory and pids controllers here' };
  const parent = join(unified, own);
  let controllers: string[];
  try {
    controllers = readFileSync(join(parent, 'cgroup.controllers'), 'utf8').trim().split(/\s+/);
  } catch (e) {
    return { why: `cannot read ${parent}/cgroup.controllers (${(e as Error).message})` };
  }
  if (!controllers.includes('memory') || !controllers.includes('pids'))
    return { why: `cgroup v2 at ${parent} offers no memory and pids controllers (${controllers.join(' ')})` };
  try {
    // a group's controllers reach its children only while it holds no process: true of the root, or of a
    // delegated group whose manager enabled them already
    const enabled = readFileSync(join(parent, 'cgroup.subtree_control'), 'utf8');
    if (!/\bmemory\b/.test(enabled) || !/\bpids\b/.test(enabled))
      writeFileSync(join(parent, 'cgroup.subtree_control'), '+memory +pids');
    dirs.push(
      makeGroups(parent, slots, (d) => writeFileSync(join(d, 'cgroup.subtree_control'), '+memory +pids')),
    );
    fds.push(openSync(dirs[0], 'r'));
    return result('cgroup v2', 2);
  } catch (e) {
    return fail(new Error(`cgroup v2 at ${parent}: ${(e as Error).message}`));
  }
}
